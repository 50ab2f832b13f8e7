"""A simulated world for the offline search: what `Trials` answers, computed from a known cost
model instead of measured on a server. The tests check the search's decisions on it, and
`tritonkit bench ablation` switches the tuner's rules off one at a time on it (tuner/rules.py).

WORLD's truth is the cost model's own P95 estimate, so "the best config" and "the edge of a
config" are known exactly; NoisyWorld adds the run-to-run noise and the drift of a shared box.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from tritonkit.loadtests.load import Load
from tritonkit.spec import Batching, ModelSpec, QueuePolicy
from tritonkit.tuner.costmodel import CostModel
from tritonkit.tuner.knobs import Knobs
from tritonkit.tuner.offline import predict_p95
from tritonkit.tuner.rules import RULES, Rules
from tritonkit.tuner.trials import Trial

SLO_MS = 25.0
# 2 ms per execution plus 0.5 ms per item: batching pays (8 items cost 6 ms, not 20 ms)
WORLD = CostModel(2.0, 0.5)




# the spec's model as the search reads it: a bounded queue of 128
MODEL_SPEC = ModelSpec(name="m", onnx="m.onnx", max_batch_size=16,
                       batching=Batching(default_queue_policy=QueuePolicy(max_queue_size=128)))


class SimulatedTrials:
    """What the search asks of `Trials`, answered by WORLD: a closed loop yields executions of
    min(clients, max batch) items; an open loop's P95 is the cost model's prediction at that rate."""

    model = "m"

    class spec:  # noqa: N801
        @staticmethod
        def model(name: str):
            return MODEL_SPEC

    def __init__(self, collapses: bool = False):
        self.trials: list[Trial] = []
        # Under more load than it can take, a config with a bounded queue either serves about its
        # capacity within the SLO and rejects the rest (healthy), or, as Triton 2.51's batcher
        # with a queue policy does, serves a fraction of it slowly (collapses).
        self.collapses = collapses

    def open_load(self, rate: float) -> Load:
        return Load(rate=rate, duration_s=3, warmup_s=0.5, drain_s=1)

    def closed_load(self, clients: int, seconds: float | None = None) -> Load:
        return Load(concurrency=clients, duration_s=seconds or 3, warmup_s=0.5, drain_s=1)

    def run(self, k: Knobs, load: Load, phase: str, classes=None) -> Trial:
        t = Trial(len(self.trials) + 1, phase, k.label(), k.to_json(), load.describe(), load.rate)
        if load.rate is None:
            b, n = min(load.concurrency, k.items), 500
            stats = {"batch_stats": [{"batch_size": b, "compute_infer": {"count": n, "ns": n * WORLD.t_ms(b) * 1e6}}]}
            t.batch_stats, t.passed = ({}, stats), True
        elif k.queue is not None and predict_p95(WORLD, k, load.rate) > SLO_MS:
            # more than it serves within the SLO: the bounded queue rejects the rest
            capacity = best_sustained(replace(k, queue=None))
            served = 0.2 * capacity if self.collapses else capacity
            t.ok_rps, t.p95_ms = round(served, 1), 480.0 if self.collapses else 0.8 * SLO_MS
            t.error_ratio = round(1 - served / load.rate, 4)
            t.errors = {"queue_full": int(t.error_ratio * load.rate * 3)}
        else:
            p95 = predict_p95(WORLD, k, load.rate)
            t.p95_ms = None if math.isinf(p95) else round(p95, 3)
            t.passed = t.p95_ms is not None and t.p95_ms <= SLO_MS
            t.ok_rps = load.rate if t.p95_ms is not None else 0.0
        self.trials.append(t)
        return with_latencies(t)


def with_latencies(t: Trial) -> Trial:
    """A simulated trial's requests, as the confirmation pools them: 100 ok ones whose P95 is the
    trial's, and its failed share on top."""
    t.latencies_ms = () if t.p95_ms is None else tuple(t.p95_ms * i / 95 for i in range(1, 101))
    if t.p95_ms is not None and t.error_ratio < 1:
        t.requests = round(100 / (1 - t.error_ratio))
    return t


def best_sustained(k: Knobs, rules: Rules = RULES) -> float:
    """The highest rate on the search's ladder at which WORLD meets the SLO with knobs k."""
    rate, best = 100.0 / rules.rate_step ** 10, 0.0
    while rate < 1e5:
        if predict_p95(WORLD, k, rate) <= SLO_MS:
            best = rate
        rate *= rules.rate_step
    return best




class NoisySimulatedTrials(SimulatedTrials):
    """WORLD on a shared machine: every open-loop P95 is multiplied by a slow drift of the machine
    (a first-order autoregression, so neighbouring runs are alike) and by each run's own noise,
    lognormal, as measured on this box (the same config at the same rate: 19.9 to 30.5 ms)."""

    def __init__(self, seed: int, target_ms: float, spread: float = 0.15, drift: float = 0.05):
        super().__init__()
        self.rng, self.target_ms, self.spread, self.drift, self.level = \
            np.random.default_rng(seed), target_ms, spread, drift, 0.0

    def run(self, k: Knobs, load: Load, phase: str, classes=None) -> Trial:
        t = super().run(k, load, phase)
        if load.rate is not None and t.p95_ms is not None:
            self.level = 0.7 * self.level + self.drift * self.rng.normal()
            t.p95_ms = round(t.p95_ms * math.exp(self.level + self.spread * self.rng.normal()), 3)
            t.passed = t.p95_ms <= self.target_ms and t.error_ratio <= 0.01
        return with_latencies(t)
