"""The one check of a measurement against a latency SLO, for every verdict that needs it: a tuner
trial, a confirmation's pooled runs, an overload check, a sweep row."""

from __future__ import annotations

from dataclasses import dataclass

# The share of a measurement's requests that may fail where nobody says otherwise (`--max-errors`):
# every tuner, bench and judge defaults to it.
ERROR_BOUND = 0.01


@dataclass(frozen=True)
class SloBound:
    """One latency objective with its allowances, the one copy every verdict reads: the P95 limit,
    the share of it a search holds back (`margin`), and the share of requests that may fail."""

    p95_ms: float
    margin: float = 0.0
    max_error_ratio: float = ERROR_BOUND

    @property
    def target_p95_ms(self) -> float:
        """What a search's trial must meet: the SLO less its margin."""
        return self.p95_ms * (1 - self.margin)

    def passes(self, p95_ms: float | None, error_ratio: float) -> bool:
        """A trial against the target (the SLO less the margin)."""
        return meets(p95_ms, self.target_p95_ms, error_ratio, self.max_error_ratio)

    def holds(self, p95_ms: float | None, error_ratio: float, error_share: float = 1.0) -> bool:
        """A claim against the SLO itself, errors within `error_share` of the bound (a confirmation
        keeps a share back: `Rules.error_margin`)."""
        return meets(p95_ms, self.p95_ms, error_ratio, self.max_error_ratio * error_share)


def meets(p95_ms: float | None, limit_ms: float | None, error_ratio: float = 0.0, max_error_ratio: float = 1.0) -> bool:
    """A P95 at or under the limit (no limit: any P95 that exists) and errors within their bound;
    a measurement without a P95 (nothing succeeded) meets nothing."""
    if p95_ms is None or p95_ms != p95_ms:  # None or NaN
        return False
    return (limit_ms is None or p95_ms <= limit_ms) and error_ratio <= max_error_ratio
