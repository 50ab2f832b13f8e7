"""`tritonkit tune --online`: a sidecar that keeps the queue delay and preferred batch size matched
to the traffic a live server sees, within guardrails.

Every observation interval it reads Triton's statistics (exact deltas: request rate, mean queue and
compute time, mean batch, failures) and refits the cost model from the per-batch-size statistics. The
setpoint follows ARCHITECTURE.md (the tuner): the smallest batch that sustains the current rate
within the cost model's headroom, and the longest delay that the rate fills (E[B] = λW) whose
estimated P95 meets the SLO.

Why statistics and not the summary quantiles: Triton's summary P95 covers a long stretch of time. After
half a minute of light load it still reported the 62 ms of the overload before it, so it cannot
tell whether the last change helped. The mean latency of one observation, from statistics deltas, can.

Changes go through `tuner.apply.LiveConfig` (reload through the API, check what Triton reports,
the last-known-good config back on a refusal or a rollback).
Guardrails: a change only when the setpoint differs by a clear factor for several observations in a
row (hysteresis), a cool-down after each change, one change in flight, and a rollback when the
observation after a change is worse (higher mean latency at a similar rate, or more failures).
`--dry-run` logs what it would do and changes nothing.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from tritonkit.clients import Client
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.results import SCHEMA
from tritonkit.loadtests.server_stats import breakdown
from tritonkit.plots import pyplot
from tritonkit.slo import ERROR_BOUND
from tritonkit.spec import Spec
from tritonkit.tuner.apply import AsServed, LiveConfig, Reached
from tritonkit.tuner.costmodel import CostModel, batch_for_rate, batch_points, delay_for, fit
from tritonkit.tuner.rules import RULES, Rules
from tritonkit.tuner.settings import TuneSettings, slo_for


@dataclass(frozen=True)
class OnlineSettings:
    interval_s: float = TuneSettings.interval_s
    cooldown_s: float = TuneSettings.cooldown_s
    dry_run: bool = False
    max_delay_us: int = 20000
    hysteresis: float = 1.5  # the setpoint must differ by this factor (or turn batching on/off)
    settle_observations: int = 2  # for this many observations in a row
    worse_margin: float = 0.2  # roll back when the next observation's mean latency is this much higher
    min_requests: int = 20  # observations with fewer requests say nothing about latency


@dataclass
class Observation:
    t_s: float
    rate: float
    requests: int
    mean_ms: float | None
    queue_ms: float | None
    mean_batch: float | None
    error_ratio: float
    delay_us: int
    preferred: list[int]
    action: str = ""


@dataclass
class Change:
    before: mc.ModelConfig
    reference: Observation  # the observation before the change, to judge the one after it


@dataclass
class OnlineState:
    observations: list[Observation] = field(default_factory=list)
    proposals: list[tuple[int, list[int]]] = field(default_factory=list)
    last_change_t: float = -1e9
    in_flight: Change | None = None
    frozen_until: float = 0.0
    changes: int = 0
    rollbacks: int = 0


class Controller:
    """Decides from observations; applies through model control (and the repository file, if given)."""

    def __init__(self, client: Client, model: str, slo_p95_ms: float, settings: OnlineSettings,
                 repo: Path | None, log: Callable[[str], None], rules: Rules = RULES):
        self.c, self.model, self.slo, self.s, self.repo, self.log = client, model, slo_p95_ms, settings, repo, log
        self.rules = rules  # the cost model's, and what makes two observations comparable
        self.state = OnlineState()
        # what is in force and what served last: the change in flight is kept once it is judged
        self.live = LiveConfig(Reached(client), client.config(model), repo, model, log,
                               target=AsServed(client, model, repo))
        self.max_batch = self.config.max_batch_size
        self.instances = sum(g.count for g in self.config.instance_group) or 1
        self.cost: CostModel | None = None

    @property
    def config(self) -> mc.ModelConfig:
        return self.live.current

    # -- reading -------------------------------------------------------------------------------

    def observe(self, before: dict, after: dict, t_s: float, dt: float) -> Observation | None:
        """The observation's figures; None when Triton's counters restarted (a reload resets them)."""
        b = breakdown(before, after)
        requests = b["requests"] + b["failed"]
        if b["requests"] < 0 or b["failed"] < 0:
            return None
        dyn = self.config.dynamic_batching
        w = Observation(round(t_s, 2), round(requests / dt, 1), requests,
                   None if b["request_ms"] is None else round(b["request_ms"], 3),
                   None if b["queue_ms"] is None else round(b["queue_ms"], 3),
                   None if b["mean_batch"] is None else round(b["mean_batch"], 2),
                   round(b["failed"] / requests, 4) if requests else 0.0,
                   int(dyn.max_queue_delay_microseconds), list(dyn.preferred_batch_size))
        with contextlib.suppress(ValueError):  # no executions yet: keep the model there is
            self.cost = fit(batch_points({}, after), self.rules)  # lifetime executions: the most points
        self.state.observations.append(w)
        return w

    # -- deciding ------------------------------------------------------------------------------

    def setpoint(self, rate: float) -> tuple[int, list[int]]:
        if self.cost is None or rate <= 0:
            return self.config.dynamic_batching.max_queue_delay_microseconds, \
                list(self.config.dynamic_batching.preferred_batch_size)
        b = batch_for_rate(self.cost, rate, self.max_batch, self.instances)
        delay = min(delay_for(self.cost, b, rate, self.slo, self.instances), self.s.max_delay_us)
        return delay, ([b] if b > 1 else [])

    def _differs(self, now: int, wanted: int, pref_now: list[int], pref_wanted: list[int]) -> bool:
        if (now == 0) != (wanted == 0) or pref_now != pref_wanted and (now or wanted):
            return True
        lo, hi = sorted((max(now, 1), max(wanted, 1)))
        return hi / lo >= self.s.hysteresis

    def step(self, w: Observation, now_t: float) -> None:
        st = self.state
        n = len(st.observations) - 1
        if st.in_flight is not None:
            self._judge(st.in_flight, w, now_t)
            st.in_flight = None
            return
        if w.requests < self.s.min_requests:
            st.proposals.clear()
            return
        delay, preferred = self.setpoint(w.rate)
        if not self._differs(w.delay_us, delay, w.preferred, preferred):
            st.proposals.clear()
            return
        if st.proposals and self._differs(st.proposals[-1][0], delay, st.proposals[-1][1], preferred):
            st.proposals.clear()  # the setpoint itself moved: count again from this one
        st.proposals.append((delay, preferred))
        if len(st.proposals) < self.s.settle_observations:
            w.action = (f"proposed delay {delay} us, preferred {preferred} "
                        f"({len(st.proposals)}/{self.s.settle_observations})")
            return
        if now_t - st.last_change_t < self.s.cooldown_s or now_t < st.frozen_until:
            w.action = "cooling down"
            return
        delay, preferred = st.proposals[-1]
        st.proposals.clear()
        if self.s.dry_run:
            w.action = f"dry run: would set delay {w.delay_us} -> {delay} us, preferred {preferred}"
            self.log(f"  [{n}] {w.action}")
            return
        after = mc.ModelConfig()
        after.CopyFrom(self.config)
        after.dynamic_batching.max_queue_delay_microseconds = delay
        del after.dynamic_batching.preferred_batch_size[:]
        after.dynamic_batching.preferred_batch_size.extend(preferred)
        before = self.config
        if self.live.apply(after) is None:
            st.in_flight = Change(before, w)
            st.last_change_t, st.changes = now_t, st.changes + 1
            w.action = (f"set delay {before.dynamic_batching.max_queue_delay_microseconds} -> {delay} us, "
                        f"preferred {preferred} at {w.rate:.0f} req/s")
            self.log(f"  [{n}] {w.action}")

    def _judge(self, change: Change, w: Observation, now_t: float) -> None:
        ref = change.reference
        r = self.rules
        similar_rate = ref.rate > 0 and 1 / r.online_similar_rate <= w.rate / ref.rate <= r.online_similar_rate
        worse_latency = (similar_rate and w.mean_ms is not None and ref.mean_ms is not None
                         and w.mean_ms > ref.mean_ms * (1 + self.s.worse_margin)
                         and w.mean_ms > r.online_latency_floor * self.slo)
        worse_errors = w.error_ratio > ref.error_ratio + ERROR_BOUND  # an observation that fails a bound's more
        if worse_latency or worse_errors:
            why = "mean latency" if worse_latency else "failures"
            self.live.restore()
            self.state.rollbacks += 1
            self.state.frozen_until = now_t + 2 * self.s.cooldown_s
            w.action = f"rolled back: {why} got worse ({ref.mean_ms} -> {w.mean_ms} ms, " \
                       f"errors {ref.error_ratio:.1%} -> {w.error_ratio:.1%})"
            self.log(f"  [{len(self.state.observations) - 1}] {w.action}")
        else:
            self.live.keep()
            w.action = "kept the change"

    # -- applying ------------------------------------------------------------------------------


def run_online(spec: Spec, model: str, url: str, settings: OnlineSettings, *,
               repo: Path | None = None, p95_ms: float | None = None, duration_s: float | None = None,
               out_dir: Path | None = None, key_headers: dict[str, str] | None = None,
               log: Callable[[str], None] = print) -> OnlineState:
    """Watch and adjust until `duration_s` passes or Ctrl-C. The spec is only read for the SLO and
    the restricted key's header (no ONNX file is needed: the sidecar runs next to the server, not
    next to the models)."""
    slo = slo_for(spec, model, p95_ms)
    headers = key_headers if key_headers is not None else _key_headers(spec)
    with Client(url, "grpc", headers) as client:
        ctl = Controller(client, model, slo, settings, repo, log)
        log(f"online tuner for {model} at {url}: SLO P95 {slo:g} ms, observation {settings.interval_s:g} s, "
            f"cool-down {settings.cooldown_s:g} s{' (dry run)' if settings.dry_run else ''}")
        t0 = time.monotonic()
        before = client.statistics(model)
        last = t0
        try:
            while duration_s is None or time.monotonic() - t0 < duration_s:
                time.sleep(max(0.0, last + settings.interval_s - time.monotonic()))
                now = time.monotonic()
                after = client.statistics(model)
                w = ctl.observe(before, after, now - t0, now - last)
                if w is not None:
                    ctl.step(w, now - t0)
                before, last = after, now
        except KeyboardInterrupt:
            if ctl.state.in_flight is not None:  # a change not yet judged is not known to be good
                ctl.live.restore()
                log("interrupted: the change being judged was rolled back")
    if out_dir is not None:
        write_online_log(Path(out_dir), model, slo, ctl.state)
    return ctl.state


def _key_headers(spec) -> dict[str, str]:
    key = spec.server.restricted_key
    value = os.environ.get(key.value_env, "")
    return {key.header: value} if value else {}


def write_online_log(out_dir: Path, model: str, slo: float, state: OnlineState) -> None:
    data = {"schema": SCHEMA, "kind": "tuner/online", "model": model, "slo_p95_ms": slo,
            "changes": state.changes, "rollbacks": state.rollbacks,
            "observations": [asdict(w) for w in state.observations]}
    write_bytes_atomic(out_dir / "online.json", json.dumps(data, indent=2).encode())
    plot_online(out_dir / "online.png", state.observations, slo)


def plot_online(path: Path, observations: list[Observation], slo: float,
                client_p95: list[tuple[float, float]] = ()) -> None:
    """Rate, latency and the delay in force per observation; `client_p95` adds what a load test saw."""
    plt = pyplot()
    t = [w.t_s for w in observations]
    fig, (a1, a2, a3) = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    a1.plot(t, [w.rate for w in observations], drawstyle="steps-post")
    a1.set_ylabel("req/s")
    a2.plot(t, [w.mean_ms for w in observations], label="server mean (observation)")
    if client_p95:
        a2.plot(*zip(*client_p95), label="client P95 (per second)", alpha=0.7)
    a2.axhline(slo, color="red", linestyle="--", label="SLO P95")
    a2.set_ylabel("ms")
    a2.legend(fontsize=8)
    a3.plot(t, [w.delay_us for w in observations], drawstyle="steps-post")
    a3.set_ylabel("queue delay, µs")
    a3.set_xlabel("seconds")
    fig.suptitle("Online tuner: load, latency and the delay it set")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())
