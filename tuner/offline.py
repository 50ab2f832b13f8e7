"""Offline tuning: a model-guided start, then a closed loop of measured trials.

1. Calibration: three short closed-loop runs at 1, B/2 and 2B clients give executions of several
   batch sizes; `T(B) = C_fixed + B * C_per` is fitted to Triton's per-batch-size statistics.
2. Baseline: the spec's own config, its capacity searched from the cost model's estimate.
3. Start: the candidate the cost model ranks best (batch, instances; the delay that the expected
   rate fills within the SLO budget).
4. Hill climbing: one knob at a time (batch x2 or /2, delay one rung up or one or two down the
   ladder, one instance more or less), best-predicted first. A neighbour must beat the incumbent
   by half a rate step (throughput objective) or 10% of P95 (latency objective): the noise of a
   short run here. A near miss, and a failure right after a pass, are measured once more before
   they count. The search stops when no neighbour is better, or at the trial budget.
5. The queue policy that protects the SLO is derived for the winner from measured times, checked
   at 1.5x and 3x its capacity (tuner/protect.py: a policy that fails is tightened once, then
   dropped with the reason in the report), and the winner is measured again to confirm it
   (stepping its rate down until it holds).

Objective: with a target rate, the lowest P95 at that rate; without one, the highest rate that
is sustained with P95 at or under the SLO and errors under the bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tritonkit.server_traits import ServerTraits, stall_risk
from tritonkit.spec import QueuePolicy
from tritonkit.tuner.costmodel import CostModel, batch_points, delay_for, fit, parallelism
from tritonkit.tuner.knobs import Knobs, batch_sizes, max_instances, neighbours, on_ladder
from tritonkit.tuner.protect import (
    OVERLOAD_FACTORS,
    OVERLOAD_GOODPUT,
    Budget,
    classes_for,
    measured_overhead_ms,
    overload_holds,
    protect,
    tightened,
)
from tritonkit.tuner.trials import Trial, Trials

RATE_STEP = 1.15  # the rate ladder of capacity searches: the resolution of a throughput figure
# Kept from the search for the end: the overload checks (one per factor) and two confirmations
FINAL_TRIALS = len(OVERLOAD_FACTORS) + 2
MAX_STEPS_DOWN = 5  # a config that fails 2x below its first rate is not worth more trials
P95_GAIN = 0.10  # a latency-objective neighbour must be this much better (P95 of a 3 s run varies ~5-10%)


@dataclass(frozen=True)
class Objective:
    slo_p95_ms: float
    rps: float | None = None  # None: maximise the sustained rate
    max_error_ratio: float = 0.01

    @property
    def kind(self) -> str:
        return "latency" if self.rps else "throughput"

    def describe(self) -> str:
        if self.rps:
            return f"lowest P95 at {self.rps:g} req/s (SLO P95 <= {self.slo_p95_ms:g} ms)"
        return f"highest sustained req/s with P95 <= {self.slo_p95_ms:g} ms and errors <= " \
               f"{100 * self.max_error_ratio:g}%"


@dataclass
class Score:
    """What one candidate achieved: the value the objective compares, and the trial behind it."""

    knobs: Knobs
    value: float  # req/s (throughput) or -P95 ms (latency); -inf when it never passed
    rate: float | None
    trial: Trial | None

    @property
    def passed(self) -> bool:
        return self.trial is not None and self.trial.passed


@dataclass
class Tuning:
    objective: Objective
    baseline: Score
    best: Score
    cost_model: CostModel | None
    bound: int
    overload: list[Trial] = field(default_factory=list)  # the checks of the protective policy, in order
    confirmed: bool = False
    stopped_because: str = ""
    policy_note: str = ""  # why the winner has no protective queue policy, when it has none


class Search:
    def __init__(self, trials: Trials, objective: Objective, bound: int, max_trials: int,
                 log: Callable[[str], None], traits: ServerTraits | None = None):
        self.t, self.obj, self.bound, self.max_trials, self.log = trials, objective, bound, max_trials, log
        self.traits = traits  # what `tritonkit probe` found the server does with a bounded queue

    @property
    def budget_left(self) -> int:
        """Trials the search may still use; the last few are kept for the overload check and the
        confirmation, so that `max_trials` is never exceeded."""
        return self.max_trials - len(self.t.trials) - FINAL_TRIALS

    @property
    def final_left(self) -> int:
        return self.max_trials - len(self.t.trials)

    def stalls(self, k: Knobs) -> str | None:
        """Why this candidate would stall the server's batcher (tritonkit probe), or None."""
        return stall_risk(k.model(self.t.spec.model(self.t.model)), self.traits)

    # -- evaluating one candidate ---------------------------------------------------------------

    def evaluate(self, k: Knobs, phase: str, start_rate: float | None = None, beat: Score | None = None) -> Score:
        if self.obj.rps:
            trial = self.t.run(k, self.t.open_load(self.obj.rps), phase)
            value = -trial.p95_ms if trial.passed else -math.inf
            return Score(k, value, self.obj.rps, trial)
        return self._capacity(k, phase, start_rate or 100.0, beat)

    def _capacity(self, k: Knobs, phase: str, rate: float, beat: Score | None) -> Score:
        """Climb the rate ladder from `rate` while the SLO holds; step down from it while it fails.
        Against an incumbent, start at its rate: failing there means "not better", so a worse
        neighbour costs a single trial."""
        if beat is not None and beat.rate:
            rate = beat.rate
        best: Score = Score(k, -math.inf, None, None)
        trial = self.t.run(k, self.t.open_load(rate), phase)
        if beat is not None and self._narrow_miss(trial) and self.budget_left > 0:
            trial = self.t.run(k, self.t.open_load(rate), phase)  # a near miss may be noise: once more
        if trial.passed:
            best = Score(k, trial.ok_rps, rate, trial)
            while self.budget_left > 0:
                rate *= RATE_STEP
                trial = self.t.run(k, self.t.open_load(rate), phase)
                if not trial.passed and self.budget_left > 0:
                    # One short run near capacity can fail by chance; a second one at the same rate
                    # tells a stall from the limit.
                    trial = self.t.run(k, self.t.open_load(rate), phase)
                if not trial.passed:
                    break
                best = Score(k, trial.ok_rps, rate, trial)
        elif beat is None:
            for _ in range(MAX_STEPS_DOWN):
                if self.budget_left <= 0:
                    break
                rate /= RATE_STEP
                trial = self.t.run(k, self.t.open_load(rate), phase)
                if trial.passed:
                    best = Score(k, trial.ok_rps, rate, trial)
                    break
        if best.trial is None:
            best = Score(k, -math.inf, None, trial)
        return best

    def _narrow_miss(self, t: Trial) -> bool:
        return (not t.passed and t.p95_ms is not None and t.p95_ms <= 1.25 * self.obj.slo_p95_ms
                and t.error_ratio <= self.obj.max_error_ratio)

    def better(self, a: Score, b: Score) -> bool:
        """Is `a` better than `b` by more than the noise of a short run?"""
        if not a.passed:
            return False
        if not b.passed:
            return True
        if self.obj.rps:
            return -a.value < -b.value * (1 - P95_GAIN)
        if a.rate is None or b.rate is None:
            return a.rate is not None
        if a.rate > b.rate * (1 + (RATE_STEP - 1) / 2):
            return True
        # The same sustained rate at a clearly lower P95 is better too (and moves the search on).
        same = a.rate > b.rate / (1 + (RATE_STEP - 1) / 2)
        return same and a.trial.p95_ms is not None and b.trial.p95_ms is not None and \
            a.trial.p95_ms < b.trial.p95_ms * (1 - P95_GAIN)

    # -- the model-guided start -------------------------------------------------------------------

    def calibrate(self) -> CostModel:
        # An unbounded queue without timeouts: calibration wants executions, not rejections.
        k = Knobs(self.bound, 2000 if self.bound else 0, 1, queue=QueuePolicy() if self.bound else None)
        points: list = []
        for clients in dict.fromkeys([1, max(1, self.bound // 2), max(2, 2 * self.bound)]):
            trial = self.t.run(k, self.t.closed_load(clients, seconds=1.0), "calibrate")
            if trial.batch_stats:
                points += batch_points(*trial.batch_stats)
        merged: dict[int, list] = {}
        for b, c, ms in points:
            m = merged.setdefault(b, [0, 0.0])
            m[0], m[1] = m[0] + c, m[1] + c * ms
        model = fit([(b, c, total / c) for b, (c, total) in sorted(merged.items())])
        self.log(f"  cost model: T(B) = {model.c_fixed_ms:.3f} ms + B x {model.c_per_ms:.3f} ms "
                 f"(from {len(model.points)} batch sizes)")
        return model

    def ranked(self, cm: CostModel) -> list[tuple[float, Knobs]]:
        """Every (batch, instances) with the delay its expected rate fills, best predicted first."""
        out = []
        for instances in range(1, max_instances() + 1):
            for b in batch_sizes(self.bound) or [0]:  # 0: no batch axis
                if self.obj.rps:
                    rate = self.obj.rps
                    k = Knobs(b, on_ladder(delay_for(cm, b, rate, self.obj.slo_p95_ms)), instances)
                    score = -predict_p95(cm, k, rate)
                else:
                    rate = self.predicted_rate(cm, Knobs(b, 0, instances))
                    k = Knobs(b, on_ladder(delay_for(cm, b, rate, self.obj.slo_p95_ms)), instances)
                    score = rate if cm.p95_ms(k.items, k.delay_us) <= self.obj.slo_p95_ms else 0.0
                out.append((score, k))
        out.sort(key=lambda x: (-x[0], x[1].instances, x[1].max_batch))
        return out

    def predicted_rate(self, cm: CostModel, k: Knobs) -> float:
        """The rate a config should sustain: 80% of its capacity (queueing near 100% breaks any SLO)."""
        return 0.8 * cm.capacity(k.items, k.instances)

    # -- the whole search ------------------------------------------------------------------------

    def run(self, baseline_knobs: Knobs) -> Tuning:
        log = self.log
        log(f"objective: {self.obj.describe()}; max batch bound {self.bound}; at most {self.max_trials} trials")
        log("== calibration")
        cm = self.calibrate()
        log("== baseline: the spec's own config")
        baseline = self.evaluate(baseline_knobs, "baseline", start_rate=self.predicted_rate(cm, baseline_knobs))
        ranked = self.ranked(cm)
        predicted, start = next(((v, k) for v, k in ranked if not self.stalls(k)), ranked[0])
        log(f"== start: {start.label()} (predicted {predicted:.1f})")
        started = self.evaluate(start, "start", start_rate=self.predicted_rate(cm, start))
        incumbent = baseline if self.better(baseline, started) or not started.passed else started
        log("== hill climbing")
        tried = {baseline.knobs, started.knobs}
        stopped = "no neighbour beat the incumbent by more than the noise"
        improved = True
        while improved:
            improved = False
            for k in self._ordered(neighbours(incumbent.knobs, self.bound), cm):
                if k in tried:
                    continue
                if self.stalls(k):  # never proposed: the probe found this server stalls on it
                    tried.add(k)
                    log(f"    skipped {k.label()}: {self.stalls(k)}")
                    continue
                if self.budget_left <= 0:
                    stopped = f"trial budget ({self.max_trials}) used"
                    break
                tried.add(k)
                score = self.evaluate(k, "neighbour", beat=incumbent)
                if self.better(score, incumbent):
                    log(f"    better: {k.label()}")
                    incumbent, improved = score, True
                    break
        tuning = Tuning(self.obj, baseline, incumbent, cm, self.bound, stopped_because=stopped)
        if incumbent.passed:
            self._protect_and_confirm(tuning, cm)
        return tuning

    def _ordered(self, ks: list[Knobs], cm: CostModel) -> list[Knobs]:
        if self.obj.rps:
            return sorted(ks, key=lambda k: predict_p95(cm, k, self.obj.rps))
        return sorted(ks, key=lambda k: -self.predicted_rate(cm, k))

    def _protect_and_confirm(self, tuning: Tuning, cm: CostModel) -> None:
        """Add the queue policy that protects the SLO, check it under overload, then measure the
        winner again; a rate that does not hold on the second run steps down until one does."""
        best = tuning.best
        k = best.knobs
        if self.obj.rps:
            rate, capacity = self.obj.rps, cm.capacity(k.items, k.instances)
        else:
            rate = capacity = best.rate or 0.0
        candidates = [k]
        if k.batching:  # a queue policy is part of dynamic batching: none without a batch axis
            protected = self._protected(tuning, k, cm, capacity)
            if protected is not None:
                candidates.insert(0, protected)
            if tuning.policy_note:
                self.log(f"   {tuning.policy_note}")
        self.log("== confirm")
        confirmed = confirm(self.t, candidates, rate, step_down=not self.obj.rps, limit=self.final_left)
        if confirmed is not None:
            tuning.best, tuning.confirmed = confirmed, True


    def _protected(self, tuning: Tuning, k: Knobs, cm: CostModel, capacity: float) -> Knobs | None:
        """The winner with a protective policy that held at every overload factor, or None (and why)."""
        b = self.t.spec.model(self.t.model).batching
        budget = Budget(self.obj.slo_p95_ms, cm.t_ms(k.items), measured_overhead_ms(self.t.trials))
        candidate, why = protect(k, b, budget, capacity, self.traits)
        self.log(f"== queue policy for the winner: {why}")
        if candidate is None:
            tuning.policy_note = why
            return None
        for attempt in (candidate, tightened(candidate)):
            if self.final_left < len(OVERLOAD_FACTORS) + 1:  # one trial stays for the confirmation
                break
            self.log(f"   overload check of {attempt.label()} at "
                     f"{', '.join(f'{f:g}x' for f in OVERLOAD_FACTORS)} {capacity:.0f} req/s")
            held = True
            for factor in OVERLOAD_FACTORS:
                check = self.t.run(attempt, self.t.open_load(factor * capacity), "overload", classes_for(b))
                tuning.overload.append(check)
                held = overload_holds(check, capacity, self.obj.slo_p95_ms)
                if not held:
                    break
            if held:
                return attempt
        if not tuning.overload:
            tuning.policy_note = "no trial was left for the overload check; the winner is written without " \
                                 "a protective queue policy"
            return None
        o = tuning.overload[-1]
        p95 = "-" if o.p95_ms is None else f"{o.p95_ms:.1f}"
        tuning.policy_note = (f"the protective queue policy failed its overload check: at {o.rate:.0f} req/s "
                              f"{o.ok_rps:.0f} req/s served at P95 {p95} ms, against {OVERLOAD_GOODPUT:.0%} of "
                              f"{capacity:.0f} req/s within {self.obj.slo_p95_ms:g} ms; the winner is written "
                              f"without it")
        return None


def confirm(trials: Trials, candidates: list[Knobs], rate: float, step_down: bool, tries: int = 3,
            limit: int | None = None) -> Score | None:
    """Measure again at `rate`; the first candidate that passes wins (later ones are fallbacks).
    A rate that does not hold steps down; a fixed target rate is measured again instead.
    At most `limit` trials."""
    end = len(trials.trials) + (limit if limit is not None else tries * len(candidates))
    for _ in range(tries):
        for k in candidates:
            if len(trials.trials) >= end:
                return None
            trial = trials.run(k, trials.open_load(rate), "confirm")
            if trial.passed:
                return Score(k, -trial.p95_ms if not step_down else trial.ok_rps, rate, trial)
        if step_down:
            rate /= RATE_STEP  # the sustained rate is lower than one lucky run said
        # else: a fixed target rate; one unlucky run on a busy machine is measured again
    return None


def predict_p95(cm: CostModel, k: Knobs, rate: float) -> float:
    """A rough P95 at `rate`: the part of the delay the rate leaves unfilled, the batch ahead and
    one's own, stretched by queueing as utilisation nears 1."""
    b = max(1, min(k.items, math.ceil(rate * (k.delay_us / 1e6 + cm.t_ms(k.items) / 1e3))))
    rho = rate / cm.capacity(b, k.instances)
    if rho >= 0.95:
        return math.inf
    wait_ms = min(k.delay_us / 1e3, b / rate * 1e3)
    # M/D/1-like queueing, with the P95 taken as about three times the mean wait
    return wait_ms + cm.t_ms(b) * (1 + 3 * rho / (2 * (1 - rho)) / parallelism(k.instances))
