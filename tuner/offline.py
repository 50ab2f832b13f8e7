"""Offline tuning: a model-guided start, a broad screen, then a closed loop of measured trials,
every decision taken against the run-to-run noise of the machine at hand (tuner/noise.py).

1. Calibration (tuner/calibration.py): three short closed-loop runs at 1, B/2 and 2B clients give
   executions of several batch sizes; `T(B) = C_fixed + B * C_per` is fitted to Triton's
   per-batch-size statistics of the runs that were not saturated, and the fit says when it
   cannot rank the configs.
2. Baseline: the spec's own config, its sustained rate searched from the cost model's estimate.
3. Screen (tuner/screen.py): where the space of batch x instances is small (it is on an edge box),
   every config runs side by side, the start among them, at the rung the start missed, and the
   field narrows round by round at rates two rungs higher; the finalist that held the highest
   rate walks to its edge. A larger space starts from the config the cost model ranks best.
4. Hill climbing: one knob at a time (batch x2 or /2, delay one rung up or one or two down the
   ladder, one instance more or less), best-predicted first, none the screen measured. For the
   lowest P95 at a rate, a neighbour is screened by one run at the incumbent's rate; one that is
   not faster there than the incumbent usually is costs that run only. Otherwise interleaved runs
   (C I I C) decide: it wins only when it is faster in both pairs by more than the measured
   noise, and holds the target in both. A candidate that `tritonkit probe` found stalls the
   server is never proposed.
5. The queue policy that protects the SLO is derived for the winner from measured times, checked
   at 1.5x and 3x its capacity (tuner/protect.py: a policy that fails is tightened once, then
   dropped with the reason in the report), and the winner is measured again to confirm it: the
   requests of three runs, pooled, must meet the SLO (tuner/pooled.py), stepping its rate down
   until they do, with the start run beside it. A winner no faster than the start beside it is
   not written; one that beat it is written even when no rate is confirmed, and says so: the
   search never returns a config worse than one it measured.

A sustained rate is the highest rate on the ladder (steps of self.rules.rate_step) that holds in most runs:
one run decides a rate only when its P95 is far (two log SDs of the noise) from the target, else the majority
of up to three. Every trial must meet the target, the SLO less a margin (`Objective.margin`), so
that the written config still meets the SLO on a bad minute.

Objective: with a target rate, the lowest P95 at that rate; without one, the highest rate that
is sustained with P95 at or under the target and errors under the bound.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from tritonkit.server_traits import ServerTraits, stall_risk
from tritonkit.slo import ERROR_BOUND, meets
from tritonkit.tuner.calibration import Calibration, calibrate
from tritonkit.tuner.costmodel import CostModel, batch_points, delay_for
from tritonkit.tuner.knobs import Knobs, max_instances, neighbours, on_ladder, powers_of_two
from tritonkit.tuner.ladder import down_from, walk_down, walk_up
from tritonkit.tuner.noise import Noise, clear, majority, settle, wins
from tritonkit.tuner.pooled import pooled, pooled_verdict
from tritonkit.tuner.protect import (
    Budget,
    classes_for,
    measured_overhead_ms,
    overload_holds,
    protect,
    tightened,
)
from tritonkit.tuner.rules import RULES, Rules
from tritonkit.tuner.screen import Halving, Seen
from tritonkit.tuner.strategy import HillClimb, drive
from tritonkit.tuner.trials import Trial, Trials


@dataclass(frozen=True)
class Objective:
    slo_p95_ms: float
    rps: float | None = None  # None: maximise the sustained rate
    max_error_ratio: float = ERROR_BOUND
    margin: float = 0.0  # share of the SLO held back: every trial must meet `target_p95_ms`

    @property
    def kind(self) -> str:
        return "latency" if self.rps else "throughput"

    @property
    def target_p95_ms(self) -> float:
        return self.slo_p95_ms * (1 - self.margin)

    def describe(self) -> str:
        target = f"{self.target_p95_ms:g} ms (SLO {self.slo_p95_ms:g} ms less a {self.margin:.0%} margin)" \
            if self.margin else f"{self.slo_p95_ms:g} ms"
        if self.rps:
            return f"lowest P95 at {self.rps:g} req/s (P95 <= {target})"
        return f"highest sustained req/s with P95 <= {target} and errors <= {100 * self.max_error_ratio:g}%"


@dataclass
class Score:
    """What one candidate achieved: the value the objective compares, and the trial behind it."""

    knobs: Knobs
    value: float  # req/s (throughput) or -P95 ms (latency); -inf when it never passed
    rate: float | None
    trial: Trial | None  # the run behind the figure (the median passing one)
    runs: list[Trial] = field(default_factory=list)  # every run at `rate` behind the verdict

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
    noise_log_sd: float | None = None  # run-to-run standard deviation of log P95 measured on this machine
    noise_repeats: int = 0  # repeated runs behind it (0: the prior alone)
    # the machine's own speed at the start and the end: {"batch", "start_ms", "end_ms", "change"}
    speed: dict | None = None
    # the best config any verdict measured (label, the highest rate it held): the written one,
    # unless `differs_because` says why not
    best_measured: tuple[str, float] | None = None
    differs_because: str = ""
    # the confirmation's runs of the winner and of the start beside it, at the same rates:
    # (winner P95, start P95), math.inf for a run that failed outright
    beside_start: list[tuple[float, float]] = field(default_factory=list)
    predicts: bool = True  # the cost model could rank candidates (else the space was screened blind)

    @property
    def beat_start(self) -> bool:
        """The winner was faster than the start in most runs beside it (none made: what the search found)."""
        if not self.beside_start:
            return not self.kept and self.best.passed
        return 2 * sum(w < s for w, s in self.beside_start) > len(self.beside_start)

    @property
    def written(self) -> bool:
        """A config is written: a confirmed one, or a winner that beat the start beside it though no
        rate was confirmed within the trials left (the report says so)."""
        return self.confirmed or (not self.kept and self.beat_start)

    @property
    def kept(self) -> bool:
        """The winner batches as the start config did (max batch, delay, instances): the search moved
        nothing, whatever queue policy it adds."""
        a, b = self.baseline.knobs, self.best.knobs
        return (a.max_batch, a.delay_us, a.instances) == (b.max_batch, b.delay_us, b.instances)


class Search:
    def __init__(self, trials: Trials, objective: Objective, bound: int, max_trials: int,
                 log: Callable[[str], None], traits: ServerTraits | None = None, rules: Rules = RULES,
                 most_instances: int | None = None):
        self.t, self.obj, self.bound, self.max_trials, self.log = trials, objective, bound, max_trials, log
        # instances per group at most: this machine's cores for the kit's own server
        self.most_instances = most_instances or max_instances()
        self.traits = traits  # what `tritonkit probe` found the server does with a bounded queue
        self.rules = rules
        self.noise = Noise(rules=rules)
        self.cm: CostModel | None = None
        # the last calibration run, to measure the machine's speed again at the end: (knobs,
        # clients, its most executed batch size, that size's mean compute ms)
        self.reference: tuple[Knobs, int, int, float] | None = None
        # the most the calibration's closed loop got through: no open-loop rate above it is offered
        # first, as the client and the server share the machine (`Rules.ceiling`)
        self.ceiling = 0.0  # 0: not calibrated
        self.calibration: Calibration | None = None
        self.held: dict[Knobs, float] = {}  # the highest rate each config held by a verdict

    @property
    def budget_left(self) -> int:
        """Trials the search may still use; the last few are kept for the overload check and the
        confirmation, so that `max_trials` is never exceeded."""
        return self.max_trials - len(self.t.trials) - self.reserved

    @property
    def reserved(self) -> int:
        """Trials kept for the end: the overload checks and the confirmation (a fixed target rate
        is confirmed at that rate only: one set of three pooled runs)."""
        r = self.rules
        return r.final_trials - r.runs if self.obj.rps else r.final_trials

    @property
    def final_left(self) -> int:
        return self.max_trials - len(self.t.trials)

    def stalls(self, k: Knobs) -> str | None:
        """Why this candidate would stall the server's batcher (tritonkit probe), or None."""
        return stall_risk(k.model(self.t.spec.model(self.t.model)), self.traits)

    # -- measuring, and the verdict at one rate -------------------------------------------------

    def measure(self, k: Knobs, rate: float, phase: str, share: float = 1.0) -> Trial:
        t = self.t.run(k, self.t.open_load(rate, share), phase)
        if t.error_ratio <= self.obj.max_error_ratio:
            self.noise.observe(_key(k, rate), t.p95_ms)
        return t

    def p95(self, t: Trial) -> float:
        """The P95 a comparison uses: infinite for a run without one or with too many errors."""
        return t.p95_ms if t.p95_ms is not None and t.error_ratio <= self.obj.max_error_ratio else math.inf

    def verdict_at(self, k: Knobs, rate: float, phase: str,
                   runs: list[Trial] | None = None) -> tuple[bool, list[Trial]]:
        """Does `k` meet the target at `rate`? The one verdict (`noise.settle`): one run when it is
        clear, else the majority of three. `runs`: runs at this rate already made."""
        def is_clear(t: Trial) -> bool:
            p95 = None if math.isinf(self.p95(t)) else t.p95_ms
            return clear(p95, t.passed, self.obj.target_p95_ms, self.noise.log_sd, self.rules)

        ok, runs = settle(lambda: self.measure(k, rate, phase), lambda t: t.passed, lambda: self.budget_left > 0,
                          is_clear, runs, self.rules)
        if ok and rate > self.held.get(k, 0.0):
            self.held[k] = rate
        return ok, runs

    def _score(self, k: Knobs, rate: float, runs: list[Trial], ok: bool) -> Score:
        if self.obj.rps:  # latency: the median P95 of the runs, whether they passed or not
            ordered = sorted(runs, key=self.p95)
            mid = ordered[len(ordered) // 2]  # of two, the slower: no figure from the luckier run
            return Score(k, -self.p95(mid), rate, mid, runs)
        if not ok:
            return Score(k, -math.inf, None, runs[-1], runs)
        passing = sorted((r for r in runs if r.passed), key=self.p95)
        return Score(k, statistics.median(r.ok_rps for r in passing), rate, passing[len(passing) // 2], runs)

    # -- evaluating one candidate ---------------------------------------------------------------

    def evaluate(self, k: Knobs, phase: str, start_rate: float | None = None) -> Score:
        if self.obj.rps:
            ok, runs = self.verdict_at(k, self.obj.rps, phase)
            return self._score(k, self.obj.rps, runs, ok)
        return self.sustained(k, start_rate or 100.0, phase)

    def sustained(self, k: Knobs, rate: float, phase: str, given: list[Trial] | None = None) -> Score:
        """The highest rate that holds in most runs, to within one rung (`Rules.rate_step`), along
        the one ladder walk (`tuner/ladder.py`). From a `rate` that holds, the edge is bracketed
        (first at the rate the cost model predicts `k` sustains, `start_rate`) and bisected. From a
        `rate` that misses, it steps down a rung at a time; one failed run per rung is enough there
        (a rung too low costs the figure one rung), and the first pass must hold in most runs.
        `given`: runs at `rate` that already held there."""
        ok, runs = (True, given) if given else self.verdict_at(k, rate, phase)
        scores = {rate: self._score(k, rate, runs, ok)}

        def holds(x: float, first: Trial | None = None) -> bool:
            ok, runs = self.verdict_at(k, x, phase, [first] if first else None)
            if ok:
                scores[x] = self._score(k, x, runs, True)
            return ok

        def holds_below(x: float) -> bool:
            first = self.measure(k, x, phase)
            return first.passed and holds(x, first)

        def more() -> bool:
            return self.budget_left > 0

        if ok:
            predicted = self.start_rate(self.cm, k) if self.cm else None
            top, _ = walk_up(rate, holds, self.rules.rate_step, more, predicted)
        else:
            top = walk_down(rate, holds_below, self.rules.rate_step, more, self.rules.max_steps_down)
        return scores[rate if top is None else top]

    def challenge(self, inc: Score, k: Knobs, phase: str = "neighbour") -> Score | None:
        """`k`'s score when it beats the incumbent, else None.

        Against an incumbent that misses the target, a candidate that holds it wins outright. For
        the most throughput, a candidate wins when it holds the rung above the incumbent's sustained
        rate, where the incumbent stopped holding (by the verdict's noise rule: one clear run, else
        the majority of three), and then climbs to its own sustained rate. For the lowest P95 at a
        rate: one screening run there; a candidate not faster than the incumbent typically is costs
        that run only. Otherwise the incumbent twice and the candidate again (C I I C): a drift of
        the machine over the four runs hits both sides alike, and the candidate must win both pairs
        by more than the noise (noise.wins) and hold the target in both of its runs."""
        c0 = None
        if not inc.passed:  # the incumbent misses the target: a candidate that holds is better outright
            s = self.evaluate(k, phase, self.start_rate(self.cm, k))
            if s.passed or not self.obj.rps:
                return s if s.passed else None
            c0 = s.runs[-1]  # neither holds the target rate: their P95s there decide, as below
        if not self.obj.rps:
            if self.budget_left < self.rules.runs:  # a verdict it could not finish would be wasted
                return None
            above = inc.rate * self.rules.rate_step
            ok, runs = self.verdict_at(k, above, phase)
            self.log(f"    {'won' if ok else 'lost'}: {'holds' if ok else 'misses'} {above:.0f} req/s, the rung "
                     f"above the incumbent's {inc.rate:.0f}")
            return self.sustained(k, above, phase, given=runs) if ok else None
        rate = self.obj.rps
        if c0 is None:
            if self.budget_left < 1 + self.rules.paired:  # a screening run that could not be followed up is wasted
                return None
            c0 = self.measure(k, rate, phase)
        typical = self.noise.typical(_key(inc.knobs, rate))
        if typical is None or self.p95(c0) >= typical or self.budget_left < self.rules.paired:
            return None
        i1, i2 = self.measure(inc.knobs, rate, "incumbent"), self.measure(inc.knobs, rate, "incumbent")
        c1 = self.measure(k, rate, phase)
        pairs = [(self.p95(c0), self.p95(i1)), (self.p95(c1), self.p95(i2))]
        held = c0.passed and c1.passed
        won = wins(pairs, self.noise.log_sd, self.rules) and (held or not inc.passed)
        self.log(f"    {'won' if won else 'lost'}: P95 {_pairs(pairs)} ms against the incumbent's; "
                 f"noise {self.noise.log_sd:.2f}")
        return self._score(k, rate, [c0, c1], held) if won else None

    # -- the model-guided start -------------------------------------------------------------------

    def calibrate(self) -> CostModel:
        self.calibration = c = calibrate(
            lambda k, clients: self.t.run(k, self.t.closed_load(clients, seconds=1.0), "calibrate"),
            self.bound, self.obj.slo_p95_ms, self.rules, self.log)
        self.ceiling, self.reference = c.ceiling, c.reference
        return c.model

    def ranked(self, cm: CostModel) -> list[tuple[float, Knobs]]:
        """Every (batch, instances) with the delay its expected rate fills, best predicted first."""
        out = []
        for instances in range(1, self.most_instances + 1):
            for b in powers_of_two(self.bound) or [0]:  # 0: no batch axis
                rate = self.obj.rps or cm.rate_within(max(b, 1), 0, self.obj.target_p95_ms, instances)
                k = Knobs(b, on_ladder(delay_for(cm, b, rate, self.obj.slo_p95_ms, instances), self.rules), instances)
                p95 = predict_p95(cm, k, rate)
                score = -p95 if self.obj.rps else (rate if p95 <= self.obj.slo_p95_ms else 0.0)
                out.append((score, k))
        out.sort(key=lambda x: (-x[0], x[1].instances, x[1].max_batch))
        return out

    def start_rate(self, cm: CostModel, k: Knobs) -> float:
        """Where a rate search starts: the predicted rate, lowered along the ladder to where the
        model's rough P95 meets the target (a rung too high or too low costs one clear run), and
        never above what the calibration's closed loop got through."""
        rate = min(cm.sustainable(k.items, k.instances), self.ceiling or math.inf)
        for _ in range(self.rules.max_steps_down):
            if predict_p95(cm, k, rate) <= self.obj.target_p95_ms:
                break
            rate /= self.rules.rate_step
        return rate

    # -- the whole search ------------------------------------------------------------------------

    def run(self, baseline_knobs: Knobs) -> Tuning:
        log = self.log
        log(f"objective: {self.obj.describe()}; max batch bound {self.bound}; at most {self.max_trials} trials")
        log("== calibration")
        self.cm = cm = self.calibrate()
        log("== baseline: the spec's own config")
        baseline = self.evaluate(baseline_knobs, "baseline", start_rate=self.start_rate(cm, baseline_knobs))
        ranked = self.ranked(cm)
        blind = self.calibration.blind if self.calibration else ""
        if not blind and not self.obj.rps and not any(v > 0 for v, _ in ranked):
            blind = "it predicts no rate within the SLO for any config"
            log(f"  the cost model cannot predict: {blind}")
        # a screen needs a round's trials and a verdict after it; short of them, a fit that can
        # rank still gives a start worth climbing from
        if blind or (len(ranked) <= self.rules.screen_space and self.budget_left >= len(ranked) + self.rules.runs):
            incumbent, tried = self._screened(baseline, ranked, blind)
        else:
            incumbent, tried = self._started(baseline, ranked)
        log("== hill climbing")
        skipped: set[Knobs] = set()

        def moves(k: Knobs, _: Score) -> Iterator[Knobs]:
            """One knob at a time, best predicted first; never one the probe found stalls the server."""
            for n in self._ordered(neighbours(k, self.bound, self.most_instances, self.rules), cm):
                if why := self.stalls(n):
                    if n not in skipped:
                        skipped.add(n)
                        log(f"    skipped {n.label()}: {why}")
                    continue
                yield n

        climb = HillClimb(incumbent.knobs, incumbent, moves, tried=[baseline.knobs, *tried])

        def measure(k: Knobs) -> Score | None:
            score = self.challenge(climb.result, k)
            if score is not None:
                log(f"    better: {k.label()}")
            return score

        exhausted = drive(climb, measure, lambda: self.budget_left > 0)
        incumbent = climb.result
        stopped = "no neighbour beat the incumbent by more than the noise" if exhausted else \
            f"trial budget ({self.max_trials}) used"
        tuning = Tuning(self.obj, baseline, incumbent, cm, self.bound, stopped_because=stopped, predicts=not blind)
        if incumbent.passed:
            self._protect_and_confirm(tuning, cm)
        elif not self.obj.rps:
            self._lower_and_confirm(tuning)
        self._best_measured(tuning)
        tuning.noise_log_sd, tuning.noise_repeats = round(self.noise.log_sd, 3), self.noise.repeats
        log(f"noise: P95 of one config at one rate varies by {self.noise.log_sd:.0%} from run to run here "
            f"({self.noise.repeats} repeated runs{'' if self.noise.repeats else ': the prior alone'})")
        return tuning

    def _started(self, baseline: Score, ranked: list[tuple[float, Knobs]]) -> tuple[Score, list[Knobs]]:
        """A space too large to screen: the climb starts from the config the cost model ranks best,
        which must beat the baseline as any neighbour must (at the rung above the baseline's rate)."""
        predicted, start = next(((v, k) for v, k in ranked if not self.stalls(k)), ranked[0])
        self.log(f"== start: {start.label()} (predicted {predicted:.1f})")
        if start == baseline.knobs:
            return baseline, []
        return self.challenge(baseline, start, "start") or baseline, [start]

    def _screened(self, baseline: Score, ranked: list[tuple[float, Knobs]], blind: str) -> tuple[Score, list[Knobs]]:
        """The whole space screened side by side (tuner/screen.py), the start among it as it is; the
        finalist that held the highest rate walks to its edge. Returns the incumbent for the climb
        and every config screened (the climb proposes none of them again)."""
        start = baseline.knobs
        candidates = []
        # batch by batch, the instance counts side by side: a slow spell of a few runs hits
        # neighbouring configs of both kinds, never a block of one kind
        for _, k in sorted(ranked, key=lambda x: (x[1].max_batch, x[1].instances)):
            # no delay while screening: near a config's edge its queue fills batches by itself, and
            # the delay is the refinement's to move (the climb); a model's delay would screen its guess
            k = replace(k, delay_us=0)
            if (k.max_batch, k.instances) == (start.max_batch, start.instances):
                k = start
            if not self.stalls(k):
                candidates.append(k)
        if start not in candidates:
            candidates.insert(0, start)
        if self.obj.rps:
            rate = self.obj.rps
        elif baseline.passed:
            rate = baseline.rate * self.rules.rate_step  # the rung the start missed
        else:
            tried = [t.rate for t in self.t.trials if t.label == start.label() and t.rate]
            rate = min(tried, default=100.0) / self.rules.rate_step  # below the lowest it missed
        self.log(f"== screen: {len(candidates)} configs side by side at {rate:.0f} req/s"
                 + ("" if self.obj.rps else ", the rate two rungs higher each round")
                 + (f" (the cost model cannot predict: {blind})" if blind else ""))
        h = Halving(candidates, rate, fixed_rate=bool(self.obj.rps), rules=self.rules)
        runs: dict[tuple[Knobs, float], list[Trial]] = {}

        def measure(c: tuple[Knobs, float]) -> Seen:
            k, r = c
            t = self.measure(k, r, "screen", self.rules.screen_share)
            runs.setdefault(c, []).append(t)
            self.log(f"    {k.label()} at {r:.0f} req/s: P95 {'-' if t.p95_ms is None else f'{t.p95_ms:.1f}'} ms"
                     f"{'' if t.passed else ', missed'}")
            return Seen(self.p95(t), t.passed)

        drive(h, measure, lambda: self.budget_left > self.rules.runs)
        h.stop()
        best = baseline
        for f in h.finalists:
            if f.knobs == start:
                break  # the start ranked above the rest, side by side: nothing screened beat it
            if f.rate is None:
                continue
            if self.obj.rps:
                found = self._score(f.knobs, f.rate, runs[(f.knobs, f.rate)], True)
                better = best is baseline and (not baseline.passed or found.value > baseline.value)
            else:
                ok, held = self.verdict_at(f.knobs, f.rate, "finalist", runs[(f.knobs, f.rate)][-1:])
                if not ok:
                    continue
                found = self.sustained(f.knobs, f.rate, "finalist", given=held)
                better = found.value > best.value * (self.rules.rate_step if best is not baseline else 1.0)
            if better:
                best = found
        names = ", ".join(f"{f.knobs.label()} (held {'-' if f.rate is None else f'{f.rate:.0f}'})"
                          for f in h.finalists)
        self.log(f"  finalists: {names}; incumbent {best.knobs.label()}")
        return best, [k for k, _ in runs]

    def speed_check(self, tuning: Tuning) -> None:
        """Run the last calibration point again, if a trial is left, and record how the compute
        time of one batch moved since the start: on a shared box it moves by tens of percent within
        an hour, and every rate measured here moves with it (docs/tuning.md, "Decisions on a noisy machine")."""
        if self.reference is None or self.final_left <= 0:
            return
        k, clients, b, start_ms = self.reference
        self.log("== the machine's speed again: the last calibration run, repeated")
        trial = self.t.run(k, self.t.closed_load(clients, seconds=1.0), "speed")
        end_ms = next((ms for size, _, ms in batch_points(*trial.batch_stats) if size == b), None) \
            if trial.batch_stats else None
        if end_ms is None:
            return
        tuning.speed = {"batch": b, "start_ms": round(start_ms, 3), "end_ms": round(end_ms, 3),
                        "change": round(end_ms / start_ms - 1, 3)}
        self.log(f"  T({b}) {start_ms:.2f} ms at the start, {end_ms:.2f} ms now ({end_ms / start_ms - 1:+.0%})")

    def _best_measured(self, tuning: Tuning) -> None:
        """The config that held the highest rate by any verdict, against the one written: they differ
        only for a reason the report gives (a winner a paired comparison preferred, a rung within
        the noise, a start that held its own beside the winner)."""
        if self.obj.rps or not self.held:
            return
        k, rate = max(self.held.items(), key=lambda x: x[1])
        tuning.best_measured = (k.label(), round(rate, 1))
        written = tuning.best.knobs
        same = (k.max_batch, k.delay_us, k.instances) == (written.max_batch, written.delay_us, written.instances)
        if not same and not tuning.differs_because:
            mine = self.held.get(replace(written, queue=None, level_queues=()), self.held.get(written, 0.0))
            tuning.differs_because = (
                f"{k.label()} held {rate:.0f} req/s once, {written.label()} {mine:.0f}: "
                + ("within one rung, the search's resolution" if rate <= mine * self.rules.rate_step * 1.001 else
                   "it did not win its side-by-side runs"))

    def _ordered(self, ks: list[Knobs], cm: CostModel) -> list[Knobs]:
        if self.obj.rps:
            return sorted(ks, key=lambda k: predict_p95(cm, k, self.obj.rps))
        return sorted(ks, key=lambda k: -cm.sustainable(k.items, k.instances))

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
        self.log(f"== confirm: three runs, pooled, must meet the SLO itself ({self.obj.slo_p95_ms:g} ms); "
                 "pass/fail below is each run's against the search's target")
        # down the ladder as far as the trials left allow: a box that slowed after the search may
        # hold only several rungs down, and trials kept for the end are worth spending on it
        beside = None if tuning.kept else tuning.baseline.knobs
        pairs: list[tuple[Trial, Trial]] = []
        confirmed = confirm(self.t, candidates, rate, step_down=not self.obj.rps,
                            limit=self.final_left, objective=self.obj, rules=self.rules, beside=beside, pairs=pairs)
        tuning.beside_start = [(self.p95(w), self.p95(b)) for w, b in pairs]
        if pairs:
            self.log(f"  beside the start: P95 {_pairs(tuning.beside_start)} ms "
                     f"({'the winner' if tuning.beat_start else 'the start'} was faster in most)")
        if confirmed is not None:
            tuning.best, tuning.confirmed = confirmed, True
        if beside is not None and not tuning.beat_start:
            # the start held its own beside the winner: never write a config no better than it
            tuning.differs_because = f"{best.knobs.label()} was no faster than the start beside it at the confirmation"
            tuning.best, tuning.confirmed = tuning.baseline, False

    def _lower_and_confirm(self, tuning: Tuning) -> None:
        """Nothing held within the search's budget: the trials kept for the overload check and the
        confirmation go on stepping the spec's own config down from the lowest rate it was run at,
        by the confirmation's rule, so that a slow minute early on still ends in a measured figure."""
        k = tuning.baseline.knobs
        rates = [t.rate for t in self.t.trials if t.label == k.label() and t.rate]
        if not rates or self.final_left <= 0:
            return
        self.log(f"== nothing held the target within the search; the spec's own config from "
                 f"{min(rates) / self.rules.rate_step:.0f} req/s down, three pooled runs at the SLO itself")
        confirmed = confirm(self.t, [k], min(rates) / self.rules.rate_step, step_down=True,
                            limit=self.final_left, objective=self.obj, rules=self.rules)
        if confirmed is not None:
            tuning.best, tuning.confirmed = confirmed, True
            tuning.policy_note = "no protective queue policy was derived: nothing held the target within the search"

    def _protected(self, tuning: Tuning, k: Knobs, cm: CostModel, capacity: float) -> Knobs | None:
        """The winner with a protective policy that held at every overload factor, or None (and why)."""
        b = self.t.spec.model(self.t.model).batching
        budget = Budget(self.obj.slo_p95_ms, cm.t_ms(k.items), measured_overhead_ms(self.t.trials))
        candidate, why = protect(k, b, budget, capacity, self.traits, self.rules)
        self.log(f"== queue policy for the winner: {why}")
        if candidate is None:
            tuning.policy_note = why
            return None
        for attempt in (candidate, tightened(candidate)):
            if self.final_left < self.reserved:
                break  # the confirmation's trials stay reserved
            self.log(f"   overload check of {attempt.label()} at "
                     f"{', '.join(f'{f:g}x' for f in self.rules.overload_factors)} {capacity:.0f} req/s")
            held = True
            for factor in self.rules.overload_factors:
                check = self.t.run(attempt, self.t.open_load(factor * capacity), "overload", classes_for(b))
                tuning.overload.append(check)
                held = overload_holds(check, capacity, self.obj.slo_p95_ms, self.rules.overload_goodput)
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
                              f"{o.ok_rps:.0f} req/s served at P95 {p95} ms, against "
                              f"{self.rules.overload_goodput:.0%} of "
                              f"{capacity:.0f} req/s within {self.obj.slo_p95_ms:g} ms; the winner is written "
                              f"without it")
        return None


def confirm(trials: Trials, candidates: list[Knobs], rate: float, step_down: bool, objective: Objective,
            limit: int | None = None, rules: Rules = RULES, beside: Knobs | None = None,
            pairs: list[tuple[Trial, Trial]] | None = None) -> Score | None:
    """Measure again at `rate`: a candidate is confirmed where its runs, pooled, meet the SLO itself
    (`held`; the search aimed at the SLO less the margin), and the first one confirmed wins (later
    ones are fallbacks). A rate that does not hold steps down, `rules.max_steps_down` rates at most
    (the tuner's and the bench grid's winners alike); a fixed target rate is the only rate tried.
    At most `limit` trials. `beside`: the start, run after a candidate's first run at the claimed rate
    and between its runs wherever its verdict is open (W S W S W), each pair appended to `pairs`:
    whether the winner beat the start is decided in the same minutes, whatever rate it holds."""
    end = len(trials.trials) + (limit if limit is not None else rules.max_steps_down * rules.runs * len(candidates))
    found: list[Score] = []

    def more() -> bool:
        return len(trials.trials) < end

    def holds(r: float) -> bool:
        for k in candidates:
            runs: list[Trial] = []
            while True:
                verdict = confirmation_verdict(runs, objective, rules)
                if runs and beside is not None and pairs is not None and more() and (verdict is None or not pairs):
                    # the start beside the run just made: while the verdict is open, and at the claim
                    pairs.append((runs[-1], trials.run(beside, trials.open_load(r), "beside")))
                if verdict is not None or not more():
                    break
                runs.append(trials.run(k, trials.open_load(r), "confirm"))
            if verdict:
                p = pooled(runs, passed=True)
                found.append(Score(k, p.ok_rps if step_down else -p.p95_ms, r, p, runs))
                return True
            if verdict is None:
                return False  # out of trials mid-verdict
        return False

    down_from(rate, holds, rules.rate_step, more, rules.max_steps_down if step_down else 1)
    return found[0] if found else None


def confirmation_verdict(runs: list[Trial], objective: Objective, rules: Rules = RULES) -> bool | None:
    """A confirmation's verdict at one rate: the runs pooled against the SLO, and their errors
    against `rules.error_margin` of the bound (refusals come in bursts, so three short runs within
    the whole bound promise less than a long load test meets). Without pooling,
    the majority of the runs, each against the SLO."""
    max_errors = objective.max_error_ratio * rules.error_margin
    if not rules.pooled:
        return majority([meets(t.p95_ms, objective.slo_p95_ms, t.error_ratio, max_errors) for t in runs], rules) \
            if runs else None
    return pooled_verdict(runs, objective.slo_p95_ms, max_errors, rules)


def predict_p95(cm: CostModel, k: Knobs, rate: float) -> float:
    """The cost model's P95 estimate for a set of knobs."""
    return cm.p95_ms(k.items, k.delay_us, rate, k.instances)


def _key(k: Knobs, rate: float) -> tuple[str, float]:
    """What repeated runs share: the config and the rate (the label covers every knob)."""
    return k.label(), round(rate, 1)


def _pairs(pairs: list[tuple[float, float]]) -> str:
    return ", ".join(f"{c:.1f} vs {i:.1f}" for c, i in pairs)
