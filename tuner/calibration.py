"""Calibration: the batch cost model fitted from a few short closed-loop runs, and whether it can
be trusted to rank candidates at all.

Three closed loops at 1, B/2 and 2B clients make Triton execute several batch sizes; their
per-batch-size statistics give `T(B) = C_fixed + B * C_per` (`tuner/costmodel.py`). A run whose
loop was saturated says little about a batch's compute: its P95 far above the SLO means requests
queued behind one another on cores the client shares, and its compute times carry that
contention. Such runs are left out of the fit. What is left may not be enough to tell a fixed
cost from a per-item one (one batch size), or may predict no rate within the SLO for any
candidate; the calibration then says it cannot predict, and the search screens the whole space
instead of trusting a ranking of zeros (`tuner/screen.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tritonkit.spec import QueuePolicy
from tritonkit.tuner.costmodel import CostModel, batch_points, fit
from tritonkit.tuner.knobs import Knobs
from tritonkit.tuner.rules import Rules
from tritonkit.tuner.trials import Trial


@dataclass(frozen=True)
class Calibration:
    model: CostModel
    # why it cannot rank candidates ("" when it can)
    blind: str
    # the most the closed loops got through: no open-loop rate above it is offered first
    ceiling: float
    # the last unsaturated run, to measure the machine's speed again at the end: (knobs, clients,
    # its most executed batch size, that size's mean compute ms)
    reference: tuple[Knobs, int, int, float] | None

    @property
    def predicts(self) -> bool:
        return not self.blind


def saturated(trial: Trial, slo_p95_ms: float, rules: Rules) -> bool:
    """A closed loop past its knee: a P95 this many SLOs over says requests queued behind each other."""
    return trial.p95_ms is not None and trial.p95_ms > rules.saturated_slos * slo_p95_ms


def calibrate(run: Callable[[Knobs, int], Trial], bound: int, slo_p95_ms: float, rules: Rules,
              log: Callable[[str], None]) -> Calibration:
    """`run(knobs, clients)` measures one short closed loop. The queue is unbounded and has no
    timeouts: calibration wants executions, not rejections."""
    k = Knobs(bound, 2000 if bound else 0, 1, queue=QueuePolicy() if bound else None)
    kept: list = []
    left_out: list = []
    dropped: list[int] = []
    ceiling, reference = 0.0, None
    for clients in dict.fromkeys([1, max(1, bound // 2), max(2, 2 * bound)]):
        trial = run(k, clients)
        if rules.ceiling:
            ceiling = max(ceiling, trial.ok_rps)
        these = batch_points(*trial.batch_stats) if trial.batch_stats else []
        if not these:
            continue
        if saturated(trial, slo_p95_ms, rules):
            dropped.append(clients)
            left_out += these
            continue
        kept += these
        b, _, ms = max(these, key=lambda p: p[1])
        reference = (k, clients, b, ms)
    model = fit(_merged(kept or left_out), rules)
    sizes = {b for b, c, _ in model.points if c >= rules.min_executions}
    blind = ""
    if not kept:
        blind = "every calibration run was saturated (P95 over " \
                f"{rules.saturated_slos:g}x the SLO)"
    elif len(sizes) < 2:
        blind = "one batch size only: the fixed cost per execution cannot be told from the per-item one"
    if dropped:
        log(f"  left out of the fit: the closed loops at {', '.join(map(str, dropped))} clients "
            f"(saturated: P95 over {rules.saturated_slos:g}x the SLO)")
    log(f"  cost model: T(B) = {model.c_fixed_ms:.3f} ms + B x {model.c_per_ms:.3f} ms "
        f"(from {len(model.points)} batch sizes)" + (f"; it cannot predict: {blind}" if blind else ""))
    return Calibration(model, blind, ceiling, reference)


def _merged(points: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
    """Points of one batch size from several runs as one, weighted by their executions."""
    merged: dict[int, list] = {}
    for b, c, ms in points:
        m = merged.setdefault(b, [0, 0.0])
        m[0], m[1] = m[0] + c, m[1] + c * ms
    return [(b, c, total / c) for b, (c, total) in sorted(merged.items())]
