"""What one run under overload shows, from the client's side: how much was answered within the
SLO against what the server claimed, whether the interactive class got its share, and how fast a
refused request learned it was refused (`bench overload`, the demo's gateway step)."""

from __future__ import annotations

from tritonkit.loadtests.load import Load, Outcome, generator_health
from tritonkit.stats import percentile


def overload_figures(out: Outcome, load: Load, claim: float, slo_ms: float, interactive_share: float) -> dict:
    """One run's figures: goodput (answers within the SLO) over the claim, the interactive class's
    answers within the SLO over its due (min of what it offered and `interactive_share` of the
    claim), a refusal's P95, late answers, errors by kind."""
    slo_s = slo_ms / 1000
    within = [s for s in out.samples if s.latency_s is not None and s.latency_s <= slo_s]
    interactive = [s for s in out.samples if s.cls == "interactive"]
    offered_i = len(interactive) / load.duration_s
    within_i = sum(1 for s in within if s.cls == "interactive") / load.duration_s
    due_i = min(offered_i, interactive_share * claim)
    refused = [s.failed_after_s for s in out.samples if s.failed_after_s is not None and s.kind != "deadline"]
    errors: dict[str, int] = {}
    for s in out.samples:
        if s.kind:
            errors[s.kind] = errors.get(s.kind, 0) + 1
    late = sum(1 for s in out.samples if s.latency_s is not None and s.latency_s > slo_s) + out.unanswered
    health = generator_health(load, out)
    # Triton's own count over the run (warm-up included): what it executed beyond the answers the
    # client got is work for requests already refused by a deadline, the server's cores spent on nothing
    executed = None
    if out.stats_before and out.stats_after:
        executed = (int(out.stats_after["inference_stats"]["success"]["count"])
                    - int(out.stats_before["inference_stats"]["success"]["count"]))
    return {"offered_rps": round(load.rate, 1), "goodput_rps": round(len(within) / load.duration_s, 1),
            "goodput_ratio": round(len(within) / load.duration_s / claim, 3),
            "interactive_offered_rps": round(offered_i, 1),
            "interactive_within_ratio": round(within_i / due_i, 3) if due_i else None,
            "refusal_p95_ms": round(percentile(refused, 95) * 1e3, 2) if refused else None,
            "refused": len(refused), "late": late, "unanswered": out.unanswered, "errors": errors,
            "server_executed": executed, "answered": sum(1 for s in out.samples if s.latency_s is not None),
            "generator_limited": bool(health["warning"]), "generator_warning": health["warning"]}
