"""Route each request to the Triton endpoint expected to answer first, and fall back on failure.

The first URL is the edge (local) server by convention, the others remote. Per endpoint the
router keeps `P95(service) + rtt` (see endpoint.py) and sends a request where that is lowest,
which is ARCHITECTURE.md's `min(L_edge, L_remote + L_net)`. Each request has one deadline:

    choose ──► attempt ──ok──► answer
                  │  error / no answer within k x its expected latency
                  ▼
               retry on the next best endpoint, inside what is left of the deadline
               (optionally a hedge: a second copy once the first is slower than its P95,
                within a budget of extra requests)

A circuit breaker per endpoint takes out one that keeps failing (requests or pings) and lets a
single trial request back in after a cool-down. A non-best endpoint is explored with a request now
and then,
so that one which recovered is measured again: the more often, the nearer the chosen endpoint's
expected latency comes to its last known one (`_explore_interval`). Priority and Triton's queue
timeout pass through.
With `coalesce=True`, identical requests in flight share one inference (coalesce.py).

`AsyncRouter` is the asyncio implementation; `Router` runs one on a background event loop for
blocking callers (so requests from several threads coalesce with each other too).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from tritonkit.clients.breaker import CircuitBreaker
from tritonkit.clients.client import AsyncClient, ModelMeta
from tritonkit.clients.coalesce import SingleFlight, request_key
from tritonkit.clients.endpoint import Endpoint, LatencyWindow
from tritonkit.clients.errors import DeadlineExceededError, TritonRequestError, UnavailableError
from tritonkit.errors import InputError, flag_problem, input_error
from tritonkit.support import cancels_safely

# The request itself is wrong: every endpoint would refuse it, so neither retry nor blame the endpoint.
NOT_RETRYABLE = frozenset({"bad_input", "access_denied"})


class NoEndpointError(UnavailableError):
    """Every endpoint's circuit breaker is open."""


@dataclass(frozen=True)
class RouterPolicy:
    deadline_s: float = 2.0  # per request, across all attempts
    max_attempts: int = 3
    # An attempt that takes longer than factor x the endpoint's expected latency (at least the
    # floor) is given up and retried elsewhere, leaving the rest of the deadline for the retry.
    # 0 = wait the whole deadline on each attempt.
    attempt_timeout_factor: float = 5.0
    attempt_timeout_floor_s: float = 0.05
    hedge_budget: float = 0.0  # at most this share of extra (hedged) requests; 0 = no hedging
    hedge_after_s: float | None = None  # None: once the attempt is slower than its endpoint's expected latency
    explore: float = 0.1  # at most this share of requests explore a non-best endpoint, to keep measuring it ...
    explore_interval_s: float = 0.1  # ... each endpoint at most this often, scaled by how far behind it is ...
    explore_max_interval_s: float = 2.0  # ... and at least this often
    breaker_failures: int = 5  # consecutive failures that open the breaker
    breaker_cooldown_s: float = 2.0
    ping_interval_s: float = 0.5
    ping_timeout_s: float = 1.0
    window_s: float = 0.5  # how recent the service-time samples behind a P95 are (endpoint.py)
    # close() waits this long for attempts left to finish on a server that cannot take their
    # cancellation (`_give_up`); what is still out then is cancelled with the channel anyway
    drain_s: float = 5.0

    @classmethod
    def from_flags(cls, deadline_ms: float, hedge: float, duplicates: float | None = None) -> RouterPolicy:
        """The router flags of `loadtest --router` and `route`, each refused with its flag named.
        (--duplicates shapes the traffic sent through the router; it is checked with them.)"""
        checks = [(f"--deadline-ms {deadline_ms:g}", deadline_ms > 0, "give a deadline above 0 ms, e.g. 2000"),
                  (f"--hedge {hedge:g}", 0 <= hedge <= 1, "give a share within 0..1, e.g. 0.05 for at most "
                                                         "5% extra requests (0: no hedging)"),
                  (f"--duplicates {duplicates or 0:g}", duplicates is None or 0 <= duplicates < 1,
                   "give a share within 0..1 (below 1), e.g. 0.5 for half repeated payloads")]
        for flag, ok, fix in checks:
            if not ok:
                raise InputError([flag_problem(flag, fix)])
        return cls(deadline_s=deadline_ms / 1e3, hedge_budget=hedge)

    def __post_init__(self) -> None:
        checks = [
            ("deadline_s", self.deadline_s > 0, "a deadline in seconds above 0, e.g. 2.0"),
            ("max_attempts", self.max_attempts >= 1, "at least 1 attempt"),
            ("attempt_timeout_factor", self.attempt_timeout_factor >= 0, "0 (off) or a factor such as 5"),
            ("attempt_timeout_floor_s", self.attempt_timeout_floor_s >= 0, "seconds >= 0"),
            ("hedge_budget", 0 <= self.hedge_budget <= 1, "a share within 0..1, e.g. 0.05 for 5% extra requests"),
            ("hedge_after_s", self.hedge_after_s is None or self.hedge_after_s >= 0, "seconds >= 0, or unset"),
            ("explore", 0 <= self.explore < 1, "a share within 0..1, e.g. 0.1"),
            ("explore_interval_s", self.explore_interval_s >= 0, "seconds >= 0"),
            ("explore_max_interval_s", self.explore_max_interval_s >= self.explore_interval_s,
             "seconds >= explore_interval_s"),
            ("breaker_failures", self.breaker_failures >= 1, "at least 1"),
            ("breaker_cooldown_s", self.breaker_cooldown_s >= 0, "seconds >= 0"),
            ("ping_interval_s", self.ping_interval_s > 0, "seconds > 0"),
            ("ping_timeout_s", self.ping_timeout_s > 0, "seconds > 0"),
            ("window_s", self.window_s > 0, "seconds > 0"),
            ("drain_s", self.drain_s >= 0, "seconds >= 0"),
        ]
        for name, ok, fix in checks:
            if not ok:
                raise input_error("router policy", name, f"invalid value {getattr(self, name)!r}", fix)


@dataclass(frozen=True)
class Routed:
    outputs: dict[str, np.ndarray]
    endpoint: str  # URL of the endpoint that answered
    attempts: int  # endpoints tried, hedges included
    coalesced: bool = False  # answered by an identical request's inference
    first: str = ""  # URL of the endpoint chosen first (where a retry or hedge came from)


@dataclass
class _Attempt:
    ep: Endpoint
    started: float
    until: float  # give up on it at this time (monotonic)
    given_up: bool = False  # its verdict was given when the router stopped waiting; none when it ends


def parse_urls(text: str, flag: str = "--endpoints") -> list[str]:
    """`HOST:PORT,HOST:PORT,...` as the command line takes it; an InputError names the flag and the fix."""
    urls = [u.strip() for u in text.split(",") if u.strip()]
    if not urls:
        raise input_error("command line", flag, "no endpoint given",
                          f"give gRPC endpoints as {flag} HOST:PORT,HOST:PORT, the edge (local) one first")
    for u in urls:
        host, _, port = u.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise input_error("command line", flag, f"{u!r} is not HOST:PORT",
                              "write each endpoint as HOST:PORT (its gRPC port), e.g. 127.0.0.1:8001")
    if len(set(urls)) != len(urls):
        raise input_error("command line", flag, f"an endpoint is listed twice: {','.join(urls)}",
                          "list each endpoint once")
    return urls


class AsyncRouter:
    """Use inside a running event loop: `async with AsyncRouter([edge, remote]) as r: await r.infer(...)`."""

    def __init__(self, urls: list[str], policy: RouterPolicy | None = None, *, coalesce: bool = False,
                 protocol: str = "grpc", seed: int | None = None, clock: Callable[[], float] = time.monotonic,
                 connect: Callable[[str, str], AsyncClient] = AsyncClient):
        """`clock` times the estimates, breakers and exploration; `connect(url, protocol)` opens an
        endpoint's client. Both are there so that the decisions can be tested without a server."""
        if not urls:
            raise input_error("router", "urls", "no endpoint given", "pass one or more HOST:PORT, edge first")
        if len(set(urls)) != len(urls):
            raise input_error("router", "urls", f"an endpoint is listed twice: {urls}", "list each endpoint once")
        self.policy = p = policy or RouterPolicy()
        self.protocol = protocol
        roles = ["edge"] + (["remote"] if len(urls) == 2 else [f"remote{i}" for i in range(1, len(urls))])
        self._clock, self._connect = clock, connect
        self.endpoints = [Endpoint(u, roles[i], i, CircuitBreaker(p.breaker_failures, p.breaker_cooldown_s, clock),
                                   LatencyWindow(p.window_s, clock=clock)) for i, u in enumerate(urls)]
        self._flight = SingleFlight() if coalesce else None
        self._rng = random.Random(seed)
        self._pinger: asyncio.Task | None = None
        self._unfinished: set[asyncio.Task] = set()  # attempts given up on, left to finish (`_give_up`)
        self.requests = self.ok = self.routed = self.retries = self.hedges = self.explorations = 0
        self.errors: dict[str, int] = {}

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> AsyncRouter:
        for ep in self.endpoints:
            ep.client = self._connect(ep.url, self.protocol)
        # a first RTT before the first choice; the unrecorded ping before it opens the channel,
        # whose connection setup is no part of the round trip
        await asyncio.gather(*(self._ping(ep, record=False) for ep in self.endpoints))
        await asyncio.gather(*(self._ping(ep) for ep in self.endpoints))
        await asyncio.gather(*(self._learn_version(ep) for ep in self.endpoints))
        self._pinger = asyncio.create_task(self._ping_loop())
        return self

    async def _learn_version(self, ep: Endpoint) -> None:
        """Whether `ep` survives a cancelled request, from its version; unknown (no answer): not,
        and asked again after its next good ping."""
        try:
            version = await asyncio.wait_for(ep.client.server_version(), self.policy.ping_timeout_s)
        except (TritonRequestError, asyncio.TimeoutError):
            return
        ep.version = version
        ep.cancels_safely = cancels_safely(version)

    async def close(self) -> None:
        if self._pinger:
            self._pinger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pinger
        if self._unfinished:  # closing their channel would cancel them on the wire after all
            await asyncio.wait(self._unfinished, timeout=self.policy.drain_s)
            for task in list(self._unfinished):
                task.cancel()
            await asyncio.gather(*self._unfinished, return_exceptions=True)
        for ep in self.endpoints:
            if ep.client is not None:
                with contextlib.suppress(Exception):
                    await ep.client.close()

    async def __aenter__(self) -> AsyncRouter:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _ping(self, ep: Endpoint, record: bool = True) -> None:
        t0 = time.perf_counter()
        try:
            live = await asyncio.wait_for(ep.client.live(), self.policy.ping_timeout_s)
        except asyncio.TimeoutError:
            live = False
        if not record:
            return
        if live:
            ep.observe_rtt(time.perf_counter() - t0)
            if ep.version is None:
                await self._learn_version(ep)
        else:
            ep.ping_failed()

    async def _ping_loop(self) -> None:
        while True:
            await asyncio.sleep(self.policy.ping_interval_s)
            await asyncio.gather(*(self._ping(ep) for ep in self.endpoints))

    # -- requests -----------------------------------------------------------------------------
    async def infer(self, model: str, arrays: dict[str, np.ndarray], **kw) -> dict[str, np.ndarray]:
        """Outputs of one request; the same keywords as `infer_routed`."""
        return (await self.infer_routed(model, arrays, **kw)).outputs

    async def infer_routed(self, model: str, arrays: dict[str, np.ndarray], *, priority: int = 0,
                           timeout_us: int | None = None, outputs: list[str] | None = None,
                           request_id: str = "", deadline_s: float | None = None,
                           headers: dict[str, str] | None = None) -> Routed:
        """One request through the router, and where it was answered. `priority`, `timeout_us`
        (Triton's queue timeout) and `headers` go to Triton as given; `deadline_s` bounds all
        attempts together."""
        if self._pinger is None:
            raise RuntimeError("the router is not started: use `async with AsyncRouter(...)` or await start()")
        self.requests += 1
        deadline = time.monotonic() + (deadline_s if deadline_s is not None else self.policy.deadline_s)
        kw = {"priority": priority, "timeout_us": timeout_us, "outputs": outputs, "request_id": request_id,
              "headers": headers}
        try:
            if self._flight is None:
                routed = await self._route(model, arrays, kw, deadline)
            else:
                routed = await self._coalesced(model, arrays, kw, deadline)
        except TritonRequestError as e:
            self.errors[e.kind] = self.errors.get(e.kind, 0) + 1
            raise
        self.ok += 1
        return routed

    async def _coalesced(self, model: str, arrays: dict, kw: dict, deadline: float) -> Routed:
        key = request_key(model, arrays, kw["priority"], kw["outputs"])
        try:
            # the leader's own deadline bounds the shared run; a follower also keeps its own
            routed, shared = await asyncio.wait_for(
                self._flight.run(key, lambda: self._route(model, arrays, kw, deadline)),
                max(0.0, deadline - time.monotonic()) + 0.05)
        except asyncio.TimeoutError:
            raise DeadlineExceededError(f"no answer for {model!r} within its deadline (waiting on an identical "
                                        "request in flight)") from None
        return replace(routed, coalesced=True) if shared else routed

    def _choose(self, exclude: list[Endpoint]) -> Endpoint | None:
        candidates = [ep for ep in self.endpoints if ep not in exclude and ep.breaker.available()]
        if not candidates:
            return None
        best = min(candidates, key=lambda ep: (ep.score(), ep.index))
        now = self._clock()
        # a first attempt may explore an endpoint not sent to for its interval (retries never do)
        if not exclude and len(candidates) > 1 and self.explorations < self.policy.explore * self.routed:
            due = [ep for ep in candidates if ep is not best and now - ep.last_sent >= self._explore_interval(best, ep)]
            if due:
                best = self._rng.choice(due)
                best.explored += 1
                self.explorations += 1
        best.last_sent = now
        best.breaker.acquire()
        return best

    def _explore_interval(self, chosen: Endpoint, other: Endpoint) -> float:
        """How long `other` may go without a request: explore_interval_s x L_other / L_chosen, within
        explore_max_interval_s. Exploring grows as the chosen endpoint's expected latency comes up to
        the other's last known one, which is when the other may well be the better one now (an edge
        that recovered, a remote measured once at a bad moment); one known to be many times slower
        costs a lot per exploration and is unlikely to win, so it is explored rarely."""
        p = self.policy
        chosen_s, other_s = chosen.score(), other.score()
        behind = other_s / chosen_s if chosen_s > 0 else math.inf
        return min(p.explore_max_interval_s, p.explore_interval_s * max(1.0, behind))

    def _attempt_timeout(self, ep: Endpoint) -> float:
        p = self.policy
        alternatives = any(e is not ep and e.breaker.available() for e in self.endpoints)
        if not p.attempt_timeout_factor or not ep.measured or not alternatives:
            return math.inf
        return max(p.attempt_timeout_floor_s, p.attempt_timeout_factor * ep.score())

    def _hedge_at(self, ep: Endpoint, now: float) -> float:
        p = self.policy
        if p.hedge_budget <= 0 or len(self.endpoints) < 2:
            return math.inf
        if p.hedge_after_s is not None:
            return now + p.hedge_after_s
        return now + ep.score() if ep.measured else math.inf

    async def _send(self, att: _Attempt, model: str, arrays: dict, kw: dict) -> dict[str, np.ndarray]:
        ep = att.ep
        ep.sent += 1
        ep.in_flight += 1
        t0 = time.perf_counter()
        try:
            out = await ep.client.infer(model, arrays, **kw)
        except TritonRequestError as e:
            if not att.given_up:
                ep.failed_with(e.kind, time.perf_counter() - t0, e.kind not in NOT_RETRYABLE)
            raise
        finally:
            ep.in_flight -= 1
        if not att.given_up:
            ep.succeeded(time.perf_counter() - t0)
        return out

    async def _route(self, model: str, arrays: dict, kw: dict, deadline: float) -> Routed:
        self.routed += 1
        tried: list[Endpoint] = []
        pending: dict[asyncio.Task, _Attempt] = {}
        last_error: TritonRequestError | None = None
        hedge_at = math.inf

        def launch(ep: Endpoint, now: float) -> None:
            tried.append(ep)
            att = _Attempt(ep, now, min(deadline, now + self._attempt_timeout(ep)))
            task = asyncio.ensure_future(self._send(att, model, arrays, kw))
            task.add_done_callback(_retrieve)
            pending[task] = att

        try:
            while True:
                now = time.monotonic()
                if not pending:
                    if now >= deadline or len(tried) >= self.policy.max_attempts:
                        break
                    # untried endpoints first; once all were tried, any but the one that just failed
                    ep = self._choose(tried) or (self._choose(tried[-1:]) if tried else None)
                    if ep is None:
                        break
                    if tried:
                        ep.retried_to += 1
                        self.retries += 1
                    launch(ep, now)
                    hedge_at = self._hedge_at(ep, now)
                wake = min(deadline, hedge_at, *(a.until for a in pending.values()))
                await asyncio.wait(pending, timeout=max(0.0, wake - time.monotonic()),
                                   return_when=asyncio.FIRST_COMPLETED)
                for task in [t for t in pending if t.done()]:
                    att = pending.pop(task)
                    error = task.exception()
                    if error is None:
                        return Routed(task.result(), att.ep.url, len(tried), first=tried[0].url)
                    if not isinstance(error, TritonRequestError) or error.kind in NOT_RETRYABLE:
                        raise error
                    last_error = error
                now = time.monotonic()
                for task, att in list(pending.items()):
                    if now >= att.until:  # no answer in time: a timeout there, and the rest goes elsewhere
                        self._give_up(task, att)
                        pending.pop(task)
                        att.ep.failed_with("deadline", now - att.started, True)
                        last_error = DeadlineExceededError(f"{att.ep.url} gave no answer within "
                                                           f"{(att.until - att.started) * 1e3:.0f} ms")
                if pending and now >= hedge_at:
                    hedge_at = math.inf
                    if self.hedges < self.policy.hedge_budget * self.routed and (ep := self._choose(tried)):
                        ep.hedged += 1
                        self.hedges += 1
                        launch(ep, now)
        finally:
            for task, att in pending.items():  # hedges that lost the race, or attempts left on an error
                self._give_up(task, att)
                att.ep.abandoned()
        if time.monotonic() >= deadline:
            raise DeadlineExceededError(f"no endpoint answered {model!r} within the deadline "
                                        f"({len(tried)} attempt(s); last error: {last_error})")
        if last_error is not None:
            raise last_error
        raise NoEndpointError("every endpoint's circuit breaker is open: "
                              + ", ".join(f"{ep.url} ({ep.breaker.state})" for ep in self.endpoints))

    def _give_up(self, task: asyncio.Task, att: _Attempt) -> None:
        """Stop waiting for an attempt, whose verdict the caller gives now: cancelled where its
        server survives a cancelled request, else left to finish unread and unjudged (close() waits
        for it), at the cost of the work it still takes there."""
        att.given_up = True
        if att.ep.cancels_safely:
            task.cancel()
        else:
            self._unfinished.add(task)
            task.add_done_callback(self._unfinished.discard)

    # -- what it knows ------------------------------------------------------------------------
    async def metadata(self, model: str) -> ModelMeta:
        last: TritonRequestError | None = None
        for ep in sorted(self.endpoints, key=lambda e: not e.breaker.available()):
            try:
                return await ep.client.metadata(model)
            except TritonRequestError as e:
                last = e
        raise last

    async def statistics(self, model: str) -> dict:
        """Triton's statistics of `model` per endpoint (None where it did not answer) and the
        router's counters, taken together: two snapshots give a window's deltas of both."""
        async def one(ep: Endpoint) -> dict | None:
            try:
                return await asyncio.wait_for(ep.client.statistics(model), self.policy.ping_timeout_s * 2)
            except (TritonRequestError, asyncio.TimeoutError):
                return None

        stats = await asyncio.gather(*(one(ep) for ep in self.endpoints))
        return {"endpoints": {ep.url: s for ep, s in zip(self.endpoints, stats)}, "router": self.counters()}

    def counters(self) -> dict:
        return {"requests": self.requests, "ok": self.ok, "errors": dict(self.errors), "routed": self.routed,
                "retries": self.retries, "hedges": self.hedges, "explorations": self.explorations,
                "coalesce": self._flight.counters() if self._flight else None,
                "endpoints": {ep.url: ep.counters() for ep in self.endpoints}}


def _retrieve(task: asyncio.Task) -> None:
    """Mark an attempt's error as seen: hedges that lost may fail after nobody waits for them."""
    if not task.cancelled():
        task.exception()


class Router:
    """Blocking router: an AsyncRouter on an event loop in a background thread. Thread-safe; the
    same keywords as AsyncRouter. Use as a context manager, or call close()."""

    def __init__(self, urls: list[str], policy: RouterPolicy | None = None, *, coalesce: bool = False,
                 protocol: str = "grpc", seed: int | None = None):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tritonkit-router", daemon=True)
        self._thread.start()
        try:
            self._router: AsyncRouter = self._run(self._open(urls, policy, coalesce, protocol, seed))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _open(urls, policy, coalesce, protocol, seed) -> AsyncRouter:
        return await AsyncRouter(urls, policy, coalesce=coalesce, protocol=protocol, seed=seed).start()

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def endpoints(self) -> list[Endpoint]:
        return self._router.endpoints

    def infer(self, model: str, arrays: dict[str, np.ndarray], **kw) -> dict[str, np.ndarray]:
        return self._run(self._router.infer(model, arrays, **kw))

    def infer_routed(self, model: str, arrays: dict[str, np.ndarray], **kw) -> Routed:
        return self._run(self._router.infer_routed(model, arrays, **kw))

    def metadata(self, model: str) -> ModelMeta:
        return self._run(self._router.metadata(model))

    def statistics(self, model: str) -> dict:
        return self._run(self._router.statistics(model))

    def counters(self) -> dict:
        return self._run(_call(self._router.counters))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self._router.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


async def _call(fn):
    return fn()  # run a plain method on the router's loop, so it reads a consistent state
