"""What the cost model predicts for a search: the one P95 predictor for a set of knobs, the ranking of
the whole space, where a rate search starts, and the order of a climb's moves. Predictions rank
and start; measurements decide (tuner/offline.py)."""

from __future__ import annotations

import math

from tritonkit.tuner.costmodel import CostModel, delay_for
from tritonkit.tuner.knobs import Knobs, on_ladder, powers_of_two
from tritonkit.tuner.objective import Objective
from tritonkit.tuner.rules import Rules


def predict_p95(cm: CostModel, k: Knobs, rate: float) -> float:
    """The cost model's P95 estimate for a set of knobs."""
    return cm.p95_ms(k.items, k.delay_us, rate, k.instances)


def ranked(cm: CostModel, obj: Objective, bound: int, most_instances: int, rules: Rules) -> list[tuple[float, Knobs]]:
    """Every (batch, instances) with the delay its expected rate fills, best predicted first: for
    the most throughput, the score is the rate predicted within the target (0 where none is)."""
    out = []
    for instances in range(1, most_instances + 1):
        for b in powers_of_two(bound) or [0]:  # 0: no batch axis
            rate = obj.rps or cm.rate_within(max(b, 1), 0, obj.target_p95_ms, instances)
            k = Knobs(b, on_ladder(delay_for(cm, b, rate, obj.p95_ms, instances), rules), instances)
            p95 = predict_p95(cm, k, rate)
            score = -p95 if obj.rps else (rate if p95 <= obj.p95_ms else 0.0)
            out.append((score, k))
    out.sort(key=lambda x: (-x[0], x[1].instances, x[1].max_batch))
    return out


def start_rate(cm: CostModel, k: Knobs, obj: Objective, ceiling: float, rules: Rules) -> float:
    """Where a rate search starts: the predicted rate, lowered along the ladder to where the
    model's rough P95 meets the target (a rung too high or too low costs one clear run), and
    never above what the calibration's closed loop got through."""
    rate = min(cm.sustainable(k.items, k.instances), ceiling or math.inf)
    for _ in range(rules.max_steps_down):
        if predict_p95(cm, k, rate) <= obj.target_p95_ms:
            break
        rate /= rules.rate_step
    return rate


def ordered(ks: list[Knobs], cm: CostModel, obj: Objective) -> list[Knobs]:
    """A climb's moves, best predicted first."""
    if obj.rps:
        return sorted(ks, key=lambda k: predict_p95(cm, k, obj.rps))
    return sorted(ks, key=lambda k: -cm.sustainable(k.items, k.instances))
