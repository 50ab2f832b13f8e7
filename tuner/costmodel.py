"""The batch cost model `T(B) = C_fixed + B * C_per`, fitted from Triton's per-batch-size statistics.

Triton's statistics keep, per executed batch size, how many executions there were and how long
their compute stages took. A weighted least-squares line through those points is the whole model.
From it follow the figures the tuner starts from (ARCHITECTURE.md):

    capacity      Φ(B)  = p * B / T(B)          p: instances that really run in parallel
    expected batch E[B] = λ * (W + T(B))        (capped by the max batch)
    P95 estimate  L95  ≈ W' + T(E[B]) * (1 + ρ / (2(1 - ρ)) / p)
                  W' = min(W, E[B] / λ): the part of the delay the rate leaves unfilled
                  ρ  = λ / Φ(max batch): how full the instances are, against the capacity of full
                       batches, as the batcher grows its batches when a queue forms; the queueing
                       term is M/D/1's mean wait (how close it comes to measured trials:
                       docs/benchmarks.md).

One P95 estimate (`p95_ms`) and one headroom (`Rules.headroom`) serve the offline search, the online
sidecar's setpoint and the simulated world of the tests. They rank candidates; measurements decide.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from tritonkit.tuner.rules import RULES, Rules

STAGES = ("compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True)
class CostModel:
    c_fixed_ms: float
    c_per_ms: float
    points: tuple[tuple[int, int, float], ...] = ()  # (batch size, executions, mean ms) it was fitted on
    rules: Rules = field(default=RULES, compare=False, repr=False)  # saturation, headroom, reserved cores

    def t_ms(self, b: int) -> float:
        """Compute time of one execution of batch `b`."""
        return self.c_fixed_ms + b * self.c_per_ms

    def capacity(self, b: int, instances: int = 1) -> float:
        """Requests per second that batches of `b` can serve."""
        return parallelism(instances, self.rules) * b / (self.t_ms(b) / 1e3)

    def p95_ms(self, max_batch: int, delay_us: int, rate: float, instances: int = 1) -> float:
        """The rough P95 at `rate` of batches up to `max_batch` formed within `delay_us` (above);
        infinite where the load would keep full batches `Rules.saturation` busy."""
        if rate <= 0:
            return self.t_ms(1)
        full = max(1, max_batch)
        b = max(1, min(full, math.ceil(rate * (delay_us / 1e6 + self.t_ms(full) / 1e3))))
        rho = rate / self.capacity(full, instances)
        if rho >= self.rules.saturation:
            return math.inf
        wait_ms = min(delay_us / 1e3, b / rate * 1e3)
        return wait_ms + self.t_ms(b) * (1 + rho / (2 * (1 - rho)) / parallelism(instances, self.rules))

    def sustainable(self, b: int, instances: int = 1) -> float:
        """The rate batches of `b` should sustain: the rules' headroom of their capacity."""
        return self.rules.headroom * self.capacity(b, instances)

    def rate_within(self, max_batch: int, delay_us: int, p95_ms: float, instances: int = 1) -> float:
        """The highest rate whose estimated P95 meets `p95_ms`, never above the sustainable rate
        (0 when not even a lone request does): a config's predicted edge, where the headroom's
        rate alone would predict a P95 over the SLO for a model whose one execution is a large
        share of it."""
        high = self.sustainable(max(1, max_batch), instances)
        if self.p95_ms(max_batch, delay_us, high, instances) <= p95_ms:
            return high
        if self.t_ms(1) > p95_ms:
            return 0.0
        low = 0.0
        for _ in range(40):
            mid = (low + high) / 2
            low, high = (mid, high) if self.p95_ms(max_batch, delay_us, mid, instances) <= p95_ms else (low, mid)
        return low

    def to_json(self) -> dict:
        return {"c_fixed_ms": round(self.c_fixed_ms, 4), "c_per_ms": round(self.c_per_ms, 4),
                "points": [list(p) for p in self.points]}


def parallelism(instances: int, rules: Rules = RULES) -> float:
    """Instances beyond the cores left after Triton's own threads and the load generator
    (`Rules.reserved_cores`) run no faster in parallel."""
    return max(1.0, min(float(instances), (os.cpu_count() or 1) - rules.reserved_cores))


def batch_points(before: dict, after: dict) -> list[tuple[int, int, float]]:
    """(batch size, executions, mean compute ms) between two statistics snapshots of one model."""
    def table(stats: dict) -> dict[int, tuple[int, int]]:
        out = {}
        for b in stats.get("batch_stats", []):
            count = int(b["compute_infer"]["count"])
            ns = sum(int(b.get(s, {}).get("ns", 0)) for s in STAGES)
            out[int(b["batch_size"])] = (count, ns)
        return out

    a, z = table(before), table(after)
    points = []
    for size, (count, ns) in sorted(z.items()):
        c0, ns0 = a.get(size, (0, 0))
        if count - c0 > 0:
            points.append((size, count - c0, (ns - ns0) / (count - c0) / 1e6))
    return points


def fit(points: list[tuple[int, int, float]], rules: Rules = RULES) -> CostModel:
    """Weighted least squares of mean compute time on batch size; weights are execution counts.

    With one batch size only, the fixed share cannot be told apart: all of it is taken as per-item
    cost (batching then looks useless, so the tuner measures rather than trusts it)."""
    pts = [p for p in points if p[1] >= rules.min_executions] or list(points)
    if not pts:
        raise ValueError("no executions to fit: the calibration run sent no requests that Triton ran")
    w = [float(c) for _, c, _ in pts]
    x = [float(b) for b, _, _ in pts]
    y = [t for _, _, t in pts]
    sw = sum(w)
    mx = sum(wi * xi for wi, xi in zip(w, x)) / sw
    my = sum(wi * yi for wi, yi in zip(w, y)) / sw
    sxx = sum(wi * (xi - mx) ** 2 for wi, xi in zip(w, x))
    if sxx == 0:
        return CostModel(0.0, my / mx, tuple(pts), rules)
    slope = sum(wi * (xi - mx) * (yi - my) for wi, xi, yi in zip(w, x, y)) / sxx
    slope = max(slope, 1e-6)  # a batch never costs less per item than nothing
    intercept = max(0.0, my - slope * mx)
    return CostModel(intercept, slope, tuple(pts), rules)


def batch_for_rate(model: CostModel, rate: float, max_batch: int, instances: int = 1) -> int:
    """The smallest power-of-two batch (up to `max_batch`) that sustains `rate`."""
    b = 1
    while b < max_batch and model.sustainable(b, instances) < rate:
        b *= 2
    return min(b, max_batch)


def delay_for(model: CostModel, b: int, rate: float, slo_p95_ms: float, instances: int = 1) -> int:
    """Queue delay (µs) that lets `rate` fill a batch of `b` (E[B] = λW), the longest such delay
    whose estimated P95 meets the SLO."""
    if b <= 1 or rate <= 0:
        return 0
    step = model.rules.delay_step_us
    delay = int(b / rate * 1e6) // step * step
    while delay > 0 and model.p95_ms(b, delay, rate, instances) > slo_p95_ms:
        delay -= step
    return delay
