"""Whether a rate holds, judged on the requests of several runs pooled, as one load test of their
total length would judge it.

Two of three short runs passing is not enough. On a shared 2-core box the
server has slow episodes of a few seconds (up to twice as slow); a 30 s load test nearly always
meets one, while two of three 2.6 s runs mostly do not, so the rates confirmed that way missed
the SLO in the load tests that checked them (docs/tuning.md, "Decisions on a noisy machine"). Pooled, a
slow run counts for the share of the requests it really slowed, no more and no less.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from tritonkit.slo import meets
from tritonkit.stats import percentile
from tritonkit.tuner.rules import RULES, Rules
from tritonkit.tuner.trials import Trial


@dataclass(frozen=True)
class Pool:
    """The requests of several runs as one: every ok request's latency, the total and the failed."""

    latencies_ms: list[float]
    requests: int
    failed: float

    @property
    def error_ratio(self) -> float:
        return self.failed / self.requests if self.requests else 1.0

    def percentile(self, p: float) -> float | None:
        return round(percentile(self.latencies_ms, p), 3) if self.latencies_ms else None


def pool(runs: Iterable[tuple[Sequence[float], int, float]]) -> Pool:
    """(ok latencies, requests, error ratio) of each run, pooled: the one rule for a trial's runs
    (`pooled`) and for a traffic mix's, entry by entry (`tuner/mix.py`)."""
    lat: list[float] = []
    n, failed = 0, 0.0
    for latencies, requests, error_ratio in runs:
        lat += latencies
        n += requests
        failed += error_ratio * requests
    return Pool(lat, n, failed)


def pooled_verdict(runs: list[Trial], limit_ms: float, max_error_ratio: float, rules: Rules = RULES) -> bool | None:
    """True once `rules.runs` runs, pooled, have a P95 within `limit_ms` and errors within the bound. False
    as soon as a run measured nothing or could not be offered, or the requests over the limit (or
    failed) so far are more than that many runs of this size may have. None while undecided."""
    if not runs:
        return None
    if any(not t.offered or t.p95_ms is None for t in runs):
        return False
    ok_per_run = statistics.mean(len(t.latencies_ms) for t in runs)
    over = sum(sum(1 for x in t.latencies_ms if x > limit_ms) for t in runs)
    failed = sum(t.error_ratio * t.requests for t in runs)
    if over > rules.over_share * rules.runs * ok_per_run or \
            failed > max_error_ratio * rules.runs * statistics.mean(t.requests for t in runs):
        return False
    if len(runs) < rules.runs:
        return None
    p = pooled(runs)
    return meets(p.p95_ms, limit_ms, p.error_ratio, max_error_ratio)


def pooled(runs: list[Trial], passed: bool | None = None) -> Trial:
    """The runs as one trial: percentiles of all their requests, their total requests and errors,
    their mean served rate and server latency; the rest is the last run's record."""
    p = pool((t.latencies_ms, t.requests, t.error_ratio) for t in runs)
    errors: dict = {}
    for t in runs:
        for kind, count in t.errors.items():
            errors[kind] = errors.get(kind, 0) + count
    server = [t.server_ms for t in runs if t.server_ms is not None]
    last = runs[-1]
    return replace(
        last, requests=p.requests, ok_rps=round(statistics.mean(t.ok_rps for t in runs), 1),
        p50_ms=p.percentile(50), p95_ms=p.percentile(95), p99_ms=p.percentile(99), client_p95_ms=None,
        server_ms=round(statistics.mean(server), 3) if server else None,
        stalled_ms=round(sum(t.stalled_ms for t in runs), 1),
        generator_limited=any(t.generator_limited for t in runs),
        error_ratio=round(p.error_ratio, 4), errors=errors,
        seconds=round(sum(t.seconds for t in runs), 2), latencies_ms=(),
        passed=last.passed if passed is None else passed,
        note=f"{len(runs)} runs pooled (trials {', '.join(str(t.n) for t in runs)})")
