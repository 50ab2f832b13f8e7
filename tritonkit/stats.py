"""Exact latency percentiles and deltas of Triton's statistics.

Percentiles use the nearest-rank definition on every recorded sample: no histogram buckets and no
interpolation, so a reported P95 is a latency some request really had.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: the smallest sample with at least q% of samples at or below it."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def summary_ms(latencies_s: Sequence[float]) -> dict[str, float]:
    ms = [x * 1e3 for x in latencies_s]
    return {"p50_ms": percentile(ms, 50), "p90_ms": percentile(ms, 90), "p95_ms": percentile(ms, 95),
            "p99_ms": percentile(ms, 99), "max_ms": max(ms) if ms else math.nan,
            "mean_ms": sum(ms) / len(ms) if ms else math.nan}


def batch_histogram(before: dict, after: dict) -> dict[int, int]:
    """Executions per batch size between two `statistics()` snapshots of one model."""
    def counts(stats: dict) -> dict[int, int]:
        return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])}

    a, b = counts(before), counts(after)
    return {size: b[size] - a.get(size, 0) for size in sorted(b) if b[size] - a.get(size, 0) > 0}


def inference_count(before: dict, after: dict) -> int:
    """Requests (samples) inferred between two snapshots."""
    return int(after.get("inference_count", 0)) - int(before.get("inference_count", 0))


def relative_range(values: Sequence[float]) -> float | None:
    """(max - min) / median of repeated figures: what a user sees between two runs (the "spread" of
    a bench's figure; the tuner's noise is a log standard deviation, tuner/noise.py). None for fewer
    than two, or when most are 0 (a config that held nowhere has no range to give)."""
    if len(values) < 2 or statistics.median(values) <= 0:
        return None
    return (max(values) - min(values)) / statistics.median(values)


def medians(rows: Sequence[dict], keys: Sequence[str]) -> dict[str, dict | None]:
    """Each key's median, min and max over the rows that have it (None where none has): a bench's
    figure over its repeated runs."""
    out = {}
    for key in keys:
        values = [r[key] for r in rows if r.get(key) is not None]
        out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else None
    return out
