"""The gateway's in-flight limit, measured: the most requests in flight whose closed loop holds the SLO.

Under overload Envoy's circuit breaker keeps its whole limit in flight, and Triton then serves a
closed loop of that many clients: each answer waits about limit / throughput. So the limit that
keeps answers within the SLO under any overload is the largest closed loop that does, and a
closed loop is what measures it. Little's law at the claim (`configs.gateway.in_flight_limit`,
the claim's rate times the P95 there, with room for its Poisson bursts) is only the upper bound:
the P95 stands in for the mean time in the server, and the bursts' room is exactly what overload
fills.

A closed loop at n holds when its P95 is within the SLO less the search's margin (under overload
the limit is always full, so every answer waits as that closed loop's did, and the margin is what
a slower minute has); a miss is measured once more before it counts (one stall on a shared box
fails a run at any n), so a limit is never cut by one burst.
Bisection over [1, upper], in the ask-and-tell shape of `tuner/strategy.py`: `InFlightBound` never
measures; `measure_in_flight` drives it with the tuner's closed loops on the config it writes (the
overload bench drives it with its own, `benchmarks/claim.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from tritonkit.configs.gateway import in_flight_limit
from tritonkit.tuner.strategy import drive

if TYPE_CHECKING:
    from tritonkit.tuner.objective import Tuning
    from tritonkit.tuner.offline import Search

CLOSED_LOOP_S = 1.0  # each closed loop's steady window: at a P95 near the SLO, hundreds of answers
# the most closed loops a tune spends on it: a bisection below 30 with a miss run twice needs at
# most ten, and one cut short keeps the largest that held (lower: more refused, none late)
MAX_RUNS = 10


@dataclass
class InFlightBound:
    upper: int  # the most it may be (Little's law at the claim)
    held_most: int = 0  # the largest n that held so far (0: none yet)
    misses: dict[int, int] = field(default_factory=dict)

    def __post_init__(self):
        self._top = max(1, self.upper)  # the largest n not yet ruled out

    def ask(self) -> int | None:
        if self.held_most >= self._top:
            return None
        return (self.held_most + self._top + 1) // 2

    def tell(self, n: int, held: bool | None) -> None:
        if held:
            self.held_most = max(self.held_most, n)
            return
        self.misses[n] = self.misses.get(n, 0) + 1
        if self.misses[n] >= 2:
            self._top = n - 1

    @property
    def limit(self) -> int:
        """The limit to write: the largest n that held, at least 1 (one in flight serves the rest
        in turn)."""
        return max(1, self.held_most)


def measure_in_flight(search: Search, tuning: Tuning) -> None:
    """`tuning.in_flight`: the bound for the written config as served behind the gateway (without
    its queue policies, unless the spec keeps them there), below Little's law at its claim; left
    None where nothing is written or the claim has no latency to start from."""
    s = tuning.best
    if not tuning.written or s.rate is None or s.trial is None or s.trial.p95_ms is None:
        return
    behind = s.knobs if search.t.spec.server.gateway.keep_queue_policies else \
        replace(s.knobs, queue=None, level_queues=())
    upper = in_flight_limit(s.rate, s.trial.p95_ms)
    target = search.obj.target_p95_ms
    search.log(f"== in flight: the most whose closed loop holds P95 <= {target:g} ms, at most {upper} "
               "(the gateway's limit)")
    bound = InFlightBound(upper)

    runs: list[int] = []

    def held(n: int) -> bool:
        runs.append(n)
        t = search.t.run(behind, search.t.closed_load(n, seconds=CLOSED_LOOP_S), "in_flight")
        return search.obj.passes(t.p95_ms, t.error_ratio)

    drive(bound, held, lambda: len(runs) < MAX_RUNS)
    tuning.in_flight = bound.limit
    search.log(f"  {bound.limit} in flight")
