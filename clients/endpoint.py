"""What a router knows about one endpoint: its latency estimates, its breaker and its counters.

A request's latency seen by the client is network round trip plus service time (queue, compute,
(de)serialisation). The two are kept apart: pings measure the round trip even when an endpoint
gets no traffic, and each successful request adds `latency - rtt` to a window of service times.
The endpoint's expected latency is `P95(service) + rtt`, the quantity ARCHITECTURE.md routes on:
`min(L_edge, L_remote + L_net)`.
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
CACHE_S = 0.05  # a P95 is recomputed on a new sample, or once the horizon may have moved this much
MAX_LATENCIES = 100_000  # per endpoint, for reporting percentiles; oldest dropped beyond this


class LatencyWindow:
    """Recent service times. P95 over the last `horizon_s` seconds, so an endpoint that degraded
    and recovered is judged by its new samples, not by a fixed count that exploration refills
    slowly; with fewer than `min_recent` samples that recent, the last `min_recent` stand in (an
    endpoint that gets no traffic keeps its last known estimate)."""

    def __init__(self, horizon_s: float = 5.0, maxlen: int = 256, min_recent: int = 3,
                 clock: Callable[[], float] = time.monotonic):
        self.horizon_s = horizon_s
        self.min_recent = min_recent
        self._clock = clock
        self._samples: deque[tuple[float, float]] = deque(maxlen=maxlen)
        self._cached: tuple[float, float | None] | None = None  # (computed at, p95): every choice reads it

    def add(self, seconds: float) -> None:
        self._samples.append((self._clock(), max(0.0, seconds)))
        self._cached = None

    def __len__(self) -> int:
        return len(self._samples)

    def newest(self) -> float:
        """When the latest sample came in (-inf: never)."""
        return self._samples[-1][0] if self._samples else -math.inf

    def p95(self) -> float | None:
        now = self._clock()
        if self._cached is not None and now - self._cached[0] < CACHE_S:
            return self._cached[1]
        self._cached = (now, self._p95(now))
        return self._cached[1]

    def _p95(self, now: float) -> float | None:
        if not self._samples:
            return None
        since = now - self.horizon_s
        recent = [s for t, s in self._samples if t >= since]
        if len(recent) < self.min_recent:
            recent = [s for _, s in list(self._samples)[-self.min_recent:]]
        return percentile(recent, 95)


class Endpoint:
    def __init__(self, url: str, role: str, index: int, breaker: CircuitBreaker, window: LatencyWindow):
        self.url = url
        self.role = role  # "edge" for the first endpoint, "remote" for the others
        self.index = index
        self.breaker = breaker
        self.window = window
        self.client = None  # an AsyncClient, opened by the router inside its event loop
        self._rtts: deque[float] = deque(maxlen=RTT_PINGS)
        self.live = True
        self.latencies: deque[float] = deque(maxlen=MAX_LATENCIES)  # client-side, successful attempts
        self.sent = self.ok = self.failed = 0
        self.retried_to = self.hedged = self.explored = self.cancelled = 0
        self.in_flight = 0
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
        return (self.window.p95() or 0.0) + (self.rtt_s or 0.0)

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
        if not endpoint_fault:  # the request was wrong, not the endpoint
            self.breaker.release()
            return
        if kind in ("timeout", "deadline"):
            # a lower bound on its latency now: without it a stalled endpoint would keep its old estimate
            self.window.add(elapsed_s - (self.rtt_s or 0.0))
        self.breaker.failure()

    def abandoned(self) -> None:
        """A hedge that lost the race: cancelled, no verdict on the endpoint."""
        self.cancelled += 1
        self.breaker.release()

    def counters(self) -> dict:
        p95 = self.window.p95()
        return {"role": self.role, "sent": self.sent, "ok": self.ok, "failed": self.failed,
                "errors": dict(self.errors), "retried_to": self.retried_to, "hedged": self.hedged,
                "explored": self.explored, "cancelled": self.cancelled, "breaker": self.breaker.state,
                "breaker_trips": self.breaker.trips, "live": self.live, "pings": self.pings,
                "ping_failures": self.ping_failures,
                "rtt_ms": _ms(self.rtt_s), "service_p95_ms": _ms(p95),
                "score_ms": _ms(self.score()) if self.measured else None}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None or math.isnan(seconds) else round(seconds * 1e3, 3)
