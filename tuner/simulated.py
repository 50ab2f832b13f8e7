"""Simulated worlds for the offline search: what `Trials` answers, computed instead of measured.

- WORLD (`SimulatedTrials`) answers with the tuner's own cost model: the mechanics of the search
  (budgets, gates, fallbacks, the order of trials) are checked on it, where every outcome is exact.
- TRUE_WORLD (`TrueWorldTrials`) follows another law, so the tuner's cost model is wrong about it,
  as it is about a real server: batches stop paying past a knee, every further instance slows the
  others, executions vary in length (Kingman's G/G/c wait, its tail exponential), and a run now and
  then carries a stall of the client that its subtraction missed. How close the search gets to this
  world's true best, and how often it claims past a config's true edge, is what the tests and
  `tritonkit bench ablation` measure: neither can be read off the search's own model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from tritonkit.loadtests.load import Load
from tritonkit.slo import ERROR_BOUND, meets
from tritonkit.spec import Batching, GatewaySpec, ModelSpec, QueuePolicy, ServerSpec
from tritonkit.tuner.costmodel import CostModel
from tritonkit.tuner.knobs import Knobs, powers_of_two
from tritonkit.tuner.predict import predict_p95
from tritonkit.tuner.rules import RULES, Rules
from tritonkit.tuner.trials import Trial

SLO_MS = 25.0
# a fixed cost per execution four times an item's, so that batching pays and the search has a batch to find
WORLD = CostModel(2.0, 0.5)




# the spec's model as the search reads it: a bounded queue of 128
MODEL_SPEC = ModelSpec(name="m", onnx="m.onnx", max_batch_size=16,
                       batching=Batching(default_queue_policy=QueuePolicy(max_queue_size=128)))


class _SpecView:
    """The spec as the search reads it: the model, and whether a gateway stands in front."""

    def __init__(self, server: ServerSpec):
        self.server = server

    def model(self, name: str) -> ModelSpec:
        return MODEL_SPEC


class SimulatedTrials:
    """What the search asks of `Trials`, answered by WORLD: a closed loop yields executions of
    min(clients, max batch) items; an open loop's P95 is the cost model's prediction at that rate."""

    model = "m"
    spec = _SpecView(ServerSpec())

    def __init__(self, collapses: bool = False, gateway: bool = False):
        if gateway:
            self.spec = _SpecView(ServerSpec(gateway=GatewaySpec(enabled=True)))
        self.trials: list[Trial] = []
        # Under more load than it can take, a config with a bounded queue either serves about its
        # capacity within the SLO and rejects the rest (healthy), or, as Triton 2.51's batcher
        # with a queue policy does, serves a fraction of it slowly (collapses).
        self.collapses = collapses

    def open_load(self, rate: float, share: float = 1.0) -> Load:
        return Load(rate=rate, duration_s=max(2.0, 3 * share), warmup_s=0.5, drain_s=1)

    def confirm_load(self, rate: float) -> Load:
        return self.open_load(rate)

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
            t.passed = meets(t.p95_ms, SLO_MS, t.error_ratio, ERROR_BOUND)
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




@dataclass(frozen=True)
class World:
    """The true law of TRUE_WORLD's server."""

    c_fixed_ms: float = 2.0  # per execution
    c_item_ms: float = 0.5  # per item up to the knee
    knee: int = 8  # past this batch, each item costs `past_knee` times as much: batches stop paying
    past_knee: float = 2.5
    interference: float = 0.25  # each further instance slows every execution by this share
    cores: float = 2.0  # instances beyond these run no faster together
    service_cv2: float = 0.5  # squared coefficient of variation of one execution's time

    def t_ms(self, b: int, instances: int = 1) -> float:
        items = min(b, self.knee) + self.past_knee * max(0, b - self.knee)
        return (self.c_fixed_ms + self.c_item_ms * items) * (1 + self.interference * (instances - 1))

    def p95_ms(self, k: Knobs, rate: float) -> float:
        """The P95 at `rate`: the unfilled delay, the execution of the batch the batcher forms, and
        the P95 of the queue's wait (Kingman's mean wait for Poisson arrivals, an exponential tail:
        its 95th percentile is ln 20 means)."""
        if rate <= 0:
            return self.t_ms(1, k.instances)
        full, lanes = k.items, min(float(k.instances), self.cores)
        b = 1
        for _ in range(32):  # the batch: what arrives within the delay and while a lane is busy
            grown = max(1, min(full, math.ceil(rate * (k.delay_us / 1e6 + self.t_ms(b, k.instances) / 1e3 / lanes))))
            if grown == b:
                break
            b = grown
        rho = rate / (lanes * full / (self.t_ms(full, k.instances) / 1e3))
        if rho >= 1:
            return math.inf
        t = self.t_ms(b, k.instances)
        mean_wait = t * (1 + self.service_cv2) / 2 * rho / (1 - rho) / lanes
        return min(k.delay_us / 1e3, b / rate * 1e3) + t + math.log(20) * mean_wait


TRUE_WORLD = World()
# Two more laws of the shapes users bring, each with its SLO: a compute-heavy model whose one request
# takes tens of milliseconds (batches barely pay, instances do), and a tiny one whose fixed cost
# per execution dominates (batches pay until instances interfere).
HEAVY_WORLD = World(c_fixed_ms=15.0, c_item_ms=22.0, knee=2, past_knee=1.3, interference=0.1)
TINY_WORLD = World(c_fixed_ms=1.2, c_item_ms=0.1, knee=8, past_knee=2.0, interference=0.3)
WORLDS = {"knee": (TRUE_WORLD, SLO_MS), "heavy": (HEAVY_WORLD, 100.0), "tiny": (TINY_WORLD, 10.0)}


def true_edge(k: Knobs, world: World = TRUE_WORLD, slo_ms: float = SLO_MS) -> float:
    """The highest rate at which `world` meets the SLO with knobs k, to 0.1%: the edge a claim is
    judged against."""
    low, high = 1.0, 1e5
    while high / low > 1.001:
        mid = math.sqrt(low * high)
        low, high = (mid, high) if world.p95_ms(k, mid) <= slo_ms else (low, mid)
    return low


@dataclass(frozen=True)
class Episodes:
    """Slow spells of a shared box (other pods, thermal limits): a run starts one with probability
    `start`, a spell goes on into the next run with probability `stay` (a few seconds to tens of
    seconds), and every P95 within it is `low` to `high` times its own."""

    start: float = 0.12
    stay: float = 0.6
    low: float = 1.5
    high: float = 2.5


EPISODES = Episodes()


class TrueWorldTrials(SimulatedTrials):
    """TRUE_WORLD measured on a shared machine: each P95 carries a slow drift of the machine
    (a first-order autoregression), each run's own lognormal noise, and the machine's slow spells
    (`Episodes`: 2x swings lasting a few runs); one run in `stall_share` is `stall` longer still
    (the client's stall the trial's subtraction missed). A closed loop gives executions of
    min(clients, max batch) items at the world's true time, and the loop's P95 (`closed_loop`).
    Without a seed: no noise."""

    def __init__(self, seed: int | None = None, target_p95_ms: float = SLO_MS, world: World = TRUE_WORLD,
                 log_sd: float = 0.15, drift: float = 0.05, stall_share: float = 0.1, stall: float = 0.3,
                 episodes: Episodes = EPISODES):
        super().__init__()
        self.world, self.target_p95_ms = world, target_p95_ms
        self.rng = None if seed is None else np.random.default_rng(seed)
        self.log_sd, self.drift, self.stall_share, self.stall, self.level = log_sd, drift, stall_share, stall, 0.0
        self.episodes, self.slow = episodes, 1.0  # the spell in force: 1.0 is none

    def noisy(self, p95: float) -> float:
        """One run's P95 on this machine: its true one, moved by the drift, a spell, a stall and its own noise."""
        if self.rng is None or math.isinf(p95):
            return p95
        e = self.episodes
        if self.slow > 1.0 and self.rng.random() >= e.stay:
            self.slow = 1.0
        elif self.slow == 1.0 and self.rng.random() < e.start:
            self.slow = self.rng.uniform(e.low, e.high)
        self.level = 0.7 * self.level + self.drift * self.rng.normal()
        p95 *= self.slow * math.exp(self.level + self.log_sd * self.rng.normal())
        if self.rng.random() < self.stall_share:
            p95 *= 1 + self.stall
        return p95

    def run(self, k: Knobs, load: Load, phase: str, classes=None) -> Trial:
        t = Trial(len(self.trials) + 1, phase, k.label(), k.to_json(), load.describe(), load.rate)
        self.trials.append(t)
        if load.rate is None:
            b, n = min(load.concurrency, k.items), 500
            ns = n * self.world.t_ms(b, k.instances) * 1e6
            t.batch_stats = ({}, {"batch_stats": [{"batch_size": b, "compute_infer": {"count": n, "ns": ns}}]})
            t.ok_rps, p95 = closed_loop(self.world, k, load.concurrency)
            t.p95_ms, t.passed = round(self.noisy(p95), 3), True
            return t
        p95 = self.noisy(self.world.p95_ms(k, load.rate))
        t.p95_ms = None if math.isinf(p95) else round(p95, 3)
        t.ok_rps = load.rate if t.p95_ms is not None else 0.0
        t.passed = meets(t.p95_ms, self.target_p95_ms, t.error_ratio, ERROR_BOUND)
        return with_latencies(t)


def closed_loop(world: World, k: Knobs, clients: int) -> tuple[float, float]:
    """(req/s, P95 ms) of `clients` that each send the next request when the last one returns: the
    lanes execute batches of what is waiting (up to the max batch), and by Little's law each request
    takes clients / throughput; its tail a half again."""
    lanes = min(float(k.instances), world.cores)
    b = max(1, min(k.items, math.ceil(clients / lanes)))
    rps = lanes * b / (world.t_ms(b, k.instances) / 1e3)
    return rps, 1.5 * max(world.t_ms(b, k.instances), clients / rps * 1e3)


def quick_search(sim: TrueWorldTrials, bound: int, instances: int, slo_ms: float = SLO_MS) -> Knobs | None:
    """Model Analyzer's search as its quick mode runs on a small box, over the same noisy machine:
    every batch on the ladder x every instance count, no queue delay, each measured once in closed
    loops of 1, 2, 4 ... up to 2 x batch x instances clients; the best throughput measured within
    the P95 limit wins (None: no config met it)."""
    best, best_rps = None, 0.0
    for i in range(1, instances + 1):
        for b in powers_of_two(bound):
            k, clients = Knobs(b, 0, i), 1
            while clients <= 2 * b * i:
                rps, p95 = closed_loop(sim.world, k, clients)
                if sim.noisy(p95) <= slo_ms and rps > best_rps:
                    best, best_rps = k, rps
                clients *= 2
    return best
