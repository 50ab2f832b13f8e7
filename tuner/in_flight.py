"""The gateway's in-flight limit, measured: the most requests in flight whose closed loop holds the SLO.

Under overload Envoy's circuit breaker keeps its whole limit in flight, and Triton then serves a
closed loop of that many clients: each answer waits about limit / throughput. So the limit that
keeps answers within the SLO under any overload is the largest closed loop that does, and a
closed loop is what measures it. Little's law at the claim (`configs.gateway.in_flight_limit`,
the claim's rate times the P95 there, with room for its Poisson bursts) is only the upper bound:
the P95 stands in for the mean time in the server, and the bursts' room is exactly what overload
fills.

A closed loop at n holds when its P95 is within the SLO; a miss is measured once more before it
counts (one stall on a shared box fails a run at any n), so a limit is never cut by one burst.
Bisection over [1, upper], in the ask-and-tell shape of `tuner/strategy.py`: it never measures.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
