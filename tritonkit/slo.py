"""The one check of a measurement against a latency SLO, for every verdict that needs it: a tuner
trial, a confirmation's pooled runs, an overload check, a sweep row."""

from __future__ import annotations

# The share of a measurement's requests that may fail where nobody says otherwise (`--max-errors`):
# every tuner, bench and judge defaults to it.
ERROR_BOUND = 0.01


def meets(p95_ms: float | None, limit_ms: float | None, error_ratio: float = 0.0, max_error_ratio: float = 1.0) -> bool:
    """A P95 at or under the limit (no limit: any P95 that exists) and errors within their bound;
    a measurement without a P95 (nothing succeeded) meets nothing."""
    if p95_ms is None or p95_ms != p95_ms:  # None or NaN
        return False
    return (limit_ms is None or p95_ms <= limit_ms) and error_ratio <= max_error_ratio
