"""The claim a bench measures against: the highest Poisson rate at which a model's P95 holds the
SLO with no failure, found by bisection below what a closed loop of 32 clients gets (no rate
within the SLO exceeds that). One stall on a shared box fails a run at any rate, so a rate holds
when one of two runs at it holds; a bench that then loads at 0.8x the claim shows whether it was
too high."""

from __future__ import annotations

from collections.abc import Callable

from tritonkit.loadtests.asyncgen import run_load
from tritonkit.loadtests.load import Load, RequestClass, run_figures
from tritonkit.slo import SloBound
from tritonkit.tuner.in_flight import InFlightBound
from tritonkit.tuner.rules import RULES

CLAIM_STEPS = 6  # within 1/64 of the closed-loop bound
DRAIN_S = 2.0  # far past any SLO: a request still out then is late, and counted so


async def claim_rate(url: str, model: str, slo_ms: float, seconds: float, log: Callable[[str], None],
                     steps: int = CLAIM_STEPS) -> dict:
    """The claim for `model` (this module's docstring says how it is found), with each step."""
    bound_out = await run_load(url, model, Load(concurrency=32, duration_s=seconds, warmup_s=1.0, drain_s=DRAIN_S))
    bound = sum(1 for s in bound_out.samples if s.latency_s is not None) / seconds
    lo, hi, p95_at_lo, tried = 0.0, bound, None, []
    for _ in range(steps):
        rate = (lo + hi) / 2
        for _attempt in range(2):  # one stall on this box fails a run at any rate: a miss is measured again
            load = Load(rate=rate, duration_s=seconds, warmup_s=1.0, drain_s=DRAIN_S)
            f = run_figures(load, await run_load(url, model, load))
            held = f.p95_ms is not None and f.p95_ms <= slo_ms and f.error_ratio == 0
            tried.append({"rate": round(rate, 1), "p95_ms": f.p95_ms and round(f.p95_ms, 2), "held": held})
            if held:
                break
        lo, hi, p95_at_lo = (rate, hi, f.p95_ms) if held else (lo, rate, p95_at_lo)
    log(f"  claim: {lo:.0f} req/s with P95 {p95_at_lo or float('nan'):.1f} ms <= {slo_ms:g} ms "
        f"(closed loop of 32: {bound:.0f} req/s; steps {[(t['rate'], t['held']) for t in tried]})")
    return {"claim_rps": round(lo, 1), "claim_p95_ms": p95_at_lo and round(p95_at_lo, 2),
            "closed_loop_rps": round(bound, 1), "steps": tried}


async def in_flight_bound(url: str, model: str, slo_ms: float, seconds: float, upper: int,
                          log: Callable[[str], None], classes: list[RequestClass] | None = None) -> dict:
    """The gateway's limit for `model` as `tune` measures it: the largest closed loop up to `upper`
    whose P95 holds the SLO less the tuner's margin (`tuner/in_flight.py` says why and how), with
    each run. `classes`: the traffic's, as the gateway will pass it."""
    bound = SloBound(slo_ms, margin=RULES.slo_margin, max_error_ratio=0.0)  # as `tune` judges it, no error
    target = bound.target_p95_ms
    search, tried = InFlightBound(upper), []
    while (n := search.ask()) is not None:
        load = Load(concurrency=n, duration_s=seconds, warmup_s=1.0, drain_s=DRAIN_S)
        out = await run_load(url, model, load, classes)
        f = run_figures(load, out)
        held = bound.passes(f.p95_ms, f.error_ratio)
        tried.append({"in_flight": n, "rps": round(f.ok_rps, 1), "p95_ms": f.p95_ms and round(f.p95_ms, 2),
                      "held": held})
        search.tell(n, held)
    log(f"  in flight: {search.limit} (the most whose closed loop held P95 <= {target:g} ms, of at most {upper}; "
        f"steps {[(t['in_flight'], t['p95_ms'], t['held']) for t in tried]})")
    return {"in_flight": search.limit, "upper": upper, "steps": tried}
