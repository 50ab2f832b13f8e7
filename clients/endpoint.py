"""What a router knows about one endpoint: its latency estimates, its breaker and its counters.

A request's latency seen by the client is network round trip plus service time (queue, compute,
(de)serialisation). The two are kept apart: pings measure the round trip even when an endpoint
gets no traffic, and each successful request adds `latency - rtt` to a window of service times.
The endpoint's expected latency is `service estimate + rtt`, the quantity ARCHITECTURE.md routes
on: `min(L_edge, L_remote + L_net)`. Set-up is never a service time: the router opens and warms
each channel with pings before the first request, and a request is one round trip.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable

from tritonkit.clients.breaker import CircuitBreaker
from tritonkit.stats import percentile

# Round trip: the median of the last few pings. It follows a real change within a few pings and
# ignores one slow ping (the client's own event loop stalled under load, a GC pause).
RTT_PINGS = 5
# A P95 needs this many samples: over 3 it is their maximum, so one slow request (a stall, a
# connection set-up) would decide alone for as long as it stays in the window.
P95_MIN_SAMPLES = 20
# Fewer recent samples than that (an endpoint only explored now and then): the median of the newest
# few. One outlier cannot move it, and two new samples out of three follow a real change.
FEW_SAMPLES = 3
CACHE_S = 0.05  # an estimate is recomputed on a new sample, or once the horizon may have moved this much
MAX_LATENCIES = 100_000  # per endpoint, for reporting percentiles; oldest dropped beyond this


class LatencyWindow:
    """Recent service times and the estimate the router uses: the P95 of those from the last
    `horizon_s` seconds when there are at least P95_MIN_SAMPLES (an endpoint taking traffic), else
    the median of the newest FEW_SAMPLES (an endpoint that is only explored, or gets no traffic and
    keeps its last known estimate). A short horizon lets an endpoint that degraded or recovered be
    judged by its new samples within a fraction of a second: old samples of the other state would
    hold a P95 where it was (5% of them are enough)."""

    def __init__(self, horizon_s: float = 0.5, maxlen: int = 256, clock: Callable[[], float] = time.monotonic):
        self.horizon_s = horizon_s
        self._clock = clock
        self._samples: deque[tuple[float, float]] = deque(maxlen=maxlen)
        self._cached: tuple[float, float | None] | None = None  # (computed at, estimate): every choice reads it

    def add(self, seconds: float) -> None:
        self._samples.append((self._clock(), max(0.0, seconds)))
        self._cached = None

    def __len__(self) -> int:
        return len(self._samples)

    def estimate(self) -> float | None:
        now = self._clock()
        if self._cached is not None and now - self._cached[0] < CACHE_S:
            return self._cached[1]
        self._cached = (now, self._estimate(now))
        return self._cached[1]

    def _estimate(self, now: float) -> float | None:
        if not self._samples:
            return None
        since = now - self.horizon_s
        recent = [s for t, s in self._samples if t >= since]
        if len(recent) >= P95_MIN_SAMPLES:
            return percentile(recent, 95)
        return statistics.median(s for _, s in list(self._samples)[-FEW_SAMPLES:])


class Endpoint:
    def __init__(self, url: str, role: str, index: int, breaker: CircuitBreaker, window: LatencyWindow):
        self.url = url
        self.role = role  # "edge" for the first endpoint, "remote" for the others
        self.index = index
        self.breaker = breaker
        self.window = window
        self.client = None  # an AsyncClient, opened by the router inside its event loop
        # Whether an attempt given up on may be cancelled on the wire (support.cancels_safely); until
        # the server's version is known, no: Triton before 2.54 can crash on a cancelled request.
        self.cancels_safely = False
        self.version: str | None = None
        self._rtts: deque[float] = deque(maxlen=RTT_PINGS)
        self.live = True
        self.latencies: deque[float] = deque(maxlen=MAX_LATENCIES)  # client-side, successful attempts
        self.sent = self.ok = self.failed = 0
        self.retried_to = self.hedged = self.explored = self.cancelled = 0
        self.in_flight = 0
        self.last_sent = -math.inf  # when the router last chose it (its clock): explorations go to the stale
        self.pings = self.ping_failures = 0
        self.errors: dict[str, int] = {}

    # -- estimates ----------------------------------------------------------------------------
    @property
    def measured(self) -> bool:
        return len(self.window) > 0

    @property
    def rtt_s(self) -> float | None:
        return statistics.median(self._rtts) if self._rtts else None

    def score(self) -> float:
        """Expected latency here (s). Unmeasured endpoints count as fast, so they get tried."""
        return (self.window.estimate() or 0.0) + (self.rtt_s or 0.0)

    def observe_rtt(self, seconds: float) -> None:
        self.pings += 1
        self.live = True
        self._rtts.append(seconds)

    def ping_failed(self) -> None:
        self.pings += 1
        self.ping_failures += 1
        self.live = False
        self.breaker.failure()

    # -- outcomes of attempts -----------------------------------------------------------------
    def succeeded(self, latency_s: float) -> None:
        self.ok += 1
        self.latencies.append(latency_s)
        self.window.add(latency_s - (self.rtt_s or 0.0))
        self.breaker.success()

    def failed_with(self, kind: str, elapsed_s: float, endpoint_fault: bool) -> None:
        self.failed += 1
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if kind in ("timeout", "deadline"):
            # a lower bound on its latency now: without it a stalled endpoint would keep its old estimate
            self.window.add(elapsed_s - (self.rtt_s or 0.0))
        if not endpoint_fault or kind == "deadline":
            # The request was wrong, not the endpoint; or the router stopped waiting: a slow endpoint
            # is the estimate's business, which moves traffic off it within a second and sees it
            # recover through explorations. The breaker's cool-down would keep a recovered one out longer;
            # a silent one still trips it through failed pings.
            self.breaker.release()
            return
        self.breaker.failure()

    def abandoned(self) -> None:
        """A hedge that lost the race: given up on, no verdict on the endpoint."""
        self.cancelled += 1
        self.breaker.release()

    def counters(self) -> dict:
        service = self.window.estimate()
        return {"role": self.role, "sent": self.sent, "ok": self.ok, "failed": self.failed,
                "errors": dict(self.errors), "retried_to": self.retried_to, "hedged": self.hedged,
                "explored": self.explored, "cancelled": self.cancelled, "breaker": self.breaker.state,
                "breaker_trips": self.breaker.trips, "live": self.live, "pings": self.pings,
                "ping_failures": self.ping_failures,
                "rtt_ms": _ms(self.rtt_s), "service_ms": _ms(service),
                "score_ms": _ms(self.score()) if self.measured else None}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None or math.isnan(seconds) else round(seconds * 1e3, 3)
