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
   Where the model pads lengths drawn from a distribution, the bucket edges are screened the same
   way next, with that batching: one least-padding edge set per bucket count (tuner/buckets.py)
   beside the spec's own.
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

Objective: with a target rate, the lowest P95 at that rate; without one, the highest rate that
is sustained with P95 at or under the target and errors under the bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from tritonkit.server_traits import ServerTraits, stall_risk
from tritonkit.tuner.calibration import Calibration, calibrate
from tritonkit.tuner.confirm import held, lower_and_confirm, protect_and_confirm
from tritonkit.tuner.costmodel import CostModel, batch_points
from tritonkit.tuner.knobs import Knobs, max_instances, neighbours
from tritonkit.tuner.objective import Objective, Score, Tuning
from tritonkit.tuner.predict import ordered, ranked
from tritonkit.tuner.rates import Rates
from tritonkit.tuner.rules import RULES, Rules
from tritonkit.tuner.screen import Finalist, Halving, Seen
from tritonkit.tuner.strategy import HillClimb, drive
from tritonkit.tuner.trials import Trial, Trials


class Search(Rates):
    """The offline search over one model's knobs (the steps above), on the measuring and verdicts of
    `tuner/rates.py`."""

    def __init__(self, trials: Trials, objective: Objective, bound: int, max_trials: int,
                 log: Callable[[str], None], traits: ServerTraits | None = None, rules: Rules = RULES,
                 most_instances: int | None = None, edge_sets: list[tuple[int, ...]] = ()):
        super().__init__(trials, objective, max_trials, log, rules)
        self.bound = bound
        self.edge_sets = edge_sets  # the bucket edges to screen (tuner/buckets.py); none: not a knob here
        # their own trials, beyond the budget: kept from the screen until their stage starts
        self.edges_share = self.edges_budget(len(edge_sets), rules)
        self.max_trials += self.edges_share
        # instances per group at most: this machine's cores for the kit's own server
        self.most_instances = most_instances or max_instances()
        self.traits = traits  # what `tritonkit probe` found the server does with a bounded queue
        # the last calibration run, to measure the machine's speed again at the end: (knobs,
        # clients, its most executed batch size, that size's mean compute ms)
        self.reference: tuple[Knobs, int, int, float] | None = None
        self.calibration: Calibration | None = None
        # a finalist that beat the start side by side but held nowhere on its walk: the incumbent
        # still, with no rate; the confirmation settles it beside the start (`_unsettled`)
        self.unsettled: Score | None = None

    @staticmethod
    def edges_budget(sets: int, rules: Rules = RULES) -> int:
        """Trials for the edges stage: two rounds of every set and the spec's own, and a verdict."""
        return 2 * (sets + 1) + rules.runs if sets else 0

    @property
    def reserved(self) -> int:
        return super().reserved + self.edges_share

    def stalls(self, k: Knobs) -> str | None:
        """Why this candidate would stall the server's batcher (tritonkit probe), or None."""
        return stall_risk(k.model(self.t.spec.model(self.t.model)), self.traits)

    # -- the model-guided start, and the search -------------------------------------------------

    def calibrate(self) -> CostModel:
        self.calibration = c = calibrate(
            lambda k, clients: self.t.run(k, self.t.closed_load(clients, seconds=1.0), "calibrate"),
            self.bound, self.obj.p95_ms, self.rules, self.log)
        self.ceiling, self.reference, self.predicts = c.ceiling, c.reference, c.predicts
        return c.model

    # -- the whole search ------------------------------------------------------------------------

    def run(self, baseline_knobs: Knobs) -> Tuning:
        log = self.log
        log(f"objective: {self.obj.describe()}; max batch bound {self.bound}; at most {self.max_trials} trials")
        log("== calibration")
        self.cm = cm = self.calibrate()
        log("== baseline: the spec's own config")
        baseline = self.evaluate(baseline_knobs, "baseline", self.start_rate(baseline_knobs))
        space = ranked(cm, self.obj, self.bound, self.most_instances, self.rules)
        blind = self.calibration.blind if self.calibration else ""
        if not blind and not self.obj.rps and not any(v > 0 for v, _ in space):
            blind = "it predicts no rate within the SLO for any config"
            log(f"  the cost model cannot predict: {blind}")
        self.predicts = not blind
        # a screen needs a round's trials and a verdict after it; short of them, a fit that can
        # rank still gives a start worth climbing from
        if blind or (len(space) <= self.rules.screen_space and self.budget_left >= len(space) + self.rules.runs):
            incumbent, tried = self._screened(baseline, space, blind)
        else:
            incumbent, tried = self._started(baseline, space)
        if self.edge_sets:
            incumbent, bucketed = self._bucketed(incumbent)
            tried += bucketed
        log("== hill climbing")
        skipped: set[Knobs] = set()

        def moves(k: Knobs, _: Score) -> Iterator[Knobs]:
            """One knob at a time, best predicted first; never one the probe found stalls the server."""
            for n in ordered(neighbours(k, self.bound, self.most_instances, self.rules), cm, self.obj):
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

        if incumbent is self.unsettled:
            # no rate for a neighbour to beat: the confirmation settles it first
            stopped = f"no climb: {incumbent.knobs.label()} held no rate on its walk"
        else:
            exhausted = drive(climb, measure, lambda: self.budget_left > 0)
            incumbent = climb.result
            stopped = "no neighbour beat the incumbent by more than the noise" if exhausted else \
                f"trial budget ({self.max_trials}) used"
        tuning = Tuning(self.obj, baseline, incumbent, cm, self.bound, stopped_because=stopped, predicts=self.predicts)
        if incumbent.passed or incumbent is self.unsettled:
            protect_and_confirm(self, tuning, cm)
        elif not self.obj.rps:
            lower_and_confirm(self, tuning)
        self._best_measured(tuning)
        tuning.noise_log_sd, tuning.noise_repeats = round(self.noise.log_sd, 3), self.noise.repeats
        log(f"noise: P95 of one config at one rate varies by {self.noise.log_sd:.0%} from run to run here "
            f"({self.noise.repeats} repeated runs{'' if self.noise.repeats else ': the prior alone'})")
        return tuning

    def _started(self, baseline: Score, space: list[tuple[float, Knobs]]) -> tuple[Score, list[Knobs]]:
        """A space too large to screen: the climb starts from the config the cost model ranks best,
        which must beat the baseline as any neighbour must (at the rung above the baseline's rate)."""
        predicted, start = next(((v, k) for v, k in space if not self.stalls(k)), space[0])
        self.log(f"== start: {start.label()} (predicted {predicted:.1f})")
        if start == baseline.knobs:
            return baseline, []
        return self.challenge(baseline, start, "start") or baseline, [start]

    def _screened(self, baseline: Score, space: list[tuple[float, Knobs]], blind: str) -> tuple[Score, list[Knobs]]:
        """The whole space screened side by side (tuner/screen.py), the start among it as it is; the
        finalist that held the highest rate walks to its edge. Returns the incumbent for the climb
        and every config screened (the climb proposes none of them again)."""
        start = baseline.knobs
        candidates, prior = [], {}
        # batch by batch, the instance counts side by side: a slow spell of a few runs hits
        # neighbouring configs of both kinds, never a block of one kind
        for predicted, k in sorted(space, key=lambda x: (x[1].max_batch, x[1].instances)):
            # no delay while screening: near a config's edge its queue fills batches by itself, and
            # the delay is the refinement's to move (the climb); a model's delay would screen its guess
            k = replace(k, delay_us=0)
            if (k.max_batch, k.instances) == (start.max_batch, start.instances):
                k = start
            if not self.stalls(k):
                candidates.append(k)
                prior[k] = predicted
        if start not in candidates:
            candidates.insert(0, start)
        why = f" (the cost model cannot predict: {blind})" if blind else ""
        return self._halved(baseline, candidates, "screen", why, {} if blind else prior)

    def _first_rung(self, inc: Score) -> float:
        """Where a side-by-side screen against `inc` starts: the target rate, else the rung `inc`
        missed (below the lowest it missed when it held none)."""
        if self.obj.rps:
            return self.obj.rps
        if inc.passed:
            return inc.rate * self.rules.rate_step
        tried = [t.rate for t in self.t.trials if t.label == inc.knobs.label() and t.rate]
        return min(tried, default=100.0) / self.rules.rate_step

    def _halved(self, inc: Score, candidates: list[Knobs], phase: str, why: str = "",
                prior: dict[Knobs, float] | None = None) -> tuple[Score, list[Knobs]]:
        """`candidates` (`inc`'s knobs among them) screened side by side (tuner/screen.py), `prior`
        the cost model's ranking of them where it predicts; the finalist that held the highest rate
        walks to its edge. Returns the incumbent after it and every config screened (the climb
        proposes none of them again)."""
        start = inc.knobs
        rate = self._first_rung(inc)
        self.log(f"== {phase}: {len(candidates)} configs side by side at {rate:.0f} req/s"
                 + ("" if self.obj.rps else ", the rate two rungs higher each round") + why)
        h = Halving(candidates, rate, fixed_rate=bool(self.obj.rps), rules=self.rules, prior=prior or {})
        runs: dict[tuple[Knobs, float], list[Trial]] = {}

        def measure(c: tuple[Knobs, float]) -> Seen:
            k, r = c
            t = self.measure(k, r, phase, self.rules.screen_share)
            runs.setdefault(c, []).append(t)
            self.log(f"    {k.label()} at {r:.0f} req/s: P95 {'-' if t.p95_ms is None else f'{t.p95_ms:.1f}'} ms"
                     f"{'' if t.passed else ', missed'}")
            return Seen(self.p95(t), t.passed)

        drive(h, measure, lambda: self.budget_left > self.rules.runs)
        h.stop()
        # A finalist ranked above the start beat it side by side, in the same minutes: it is the
        # incumbent wherever it turns out to hold (its own walk, down from a slower minute if need
        # be), and the confirmation runs the start beside it again. That holds too where no config
        # held the round's rate (a slow minute, or a first rung past every edge): their P95s there
        # still rank them, and the finalist walks down from that rate. Only a finalist that holds
        # nothing on its walk leaves the place to the next.
        best, chosen = inc, None
        for f in h.finalists:
            if f.knobs == start:
                break  # the start ranked above the rest, side by side: nothing screened beat it
            if self.obj.rps:
                if f.rate is None:
                    continue  # it missed the target rate itself: the climb's paired runs decide there
                found = self._score(f.knobs, f.rate, runs[(f.knobs, f.rate)], True)
            else:
                rate = f.rate or h.rate
                # every screening run there counts: one that missed and one that held leave the
                # verdict to a third
                found = self.sustained(f.knobs, rate, "finalist", prior=runs.get((f.knobs, rate), []))
            if found.passed:
                best, chosen = found, f
                break
        if chosen is None and not self.obj.rps:
            best = self._unsettled(h, start) or best
        best = self._runner_up(best, chosen, h, start)
        names = ", ".join(f"{f.knobs.label()} (held {'-' if f.rate is None else f'{f.rate:.0f}'})"
                          for f in h.finalists)
        self.log(f"  finalists: {names}; incumbent {best.knobs.label()}")
        return best, [k for k, _ in runs]

    def _unsettled(self, h: Halving, start: Knobs) -> Score | None:
        """The finalist ranked first, above the start, when no finalist held on its walk: beside a
        box that stalls, or with the search's trials spent mid-walk, a walk can end without a
        verdict, and the side-by-side rank it won is the only comparison made in the same minutes.
        It stays the incumbent, without a rate; the confirmation steps down beside the start from the
        lowest rate the walk reached, and writes it only where it holds (`confirm.py`)."""
        first = h.finalists[0] if h.finalists else None
        if first is None or first.knobs == start:
            return None
        walked = [t.rate for t in self.t.trials if t.label == first.knobs.label() and t.phase == "finalist" and t.rate]
        rate = min(walked, default=first.rate or h.rate)
        self.log(f"  {first.knobs.label()} beat the start side by side but held nowhere on its walk: the "
                 f"confirmation settles it beside the start, from {rate:.0f} req/s down")
        self.unsettled = Score(first.knobs, float("-inf"), rate, None)
        return self.unsettled

    def _runner_up(self, best: Score, chosen: Finalist | None, h: Halving, start: Knobs) -> Score:
        """A runner-up that held the screen's rate as high as the finalist that won: ranked below it
        by one run there, it is a tie within the noise, and the climb proposes no screened config
        again. It challenges the incumbent at the rung above where the incumbent holds, beside it
        (`challenge`): one losing run of the winner's walk must not leave it unmeasured above."""
        if chosen is None or self.obj.rps or chosen.rate is None:
            return best
        for g in h.finalists:
            if g is chosen or g.knobs == start or g.rate is None or g.rate < chosen.rate:
                continue
            self.log(f"  runner-up {g.knobs.label()} held {g.rate:.0f} req/s in the screen too: it challenges "
                     f"{best.knobs.label()} above {best.rate:.0f}")
            return self.challenge(best, g.knobs, "runner-up") or best
        return best

    def _bucketed(self, inc: Score) -> tuple[Score, list[Knobs]]:
        """The length-bucket edges for the incumbent's batching (`edge_sets`: the least padding for
        each bucket count), screened side by side with the edges it has now, when the budget leaves a
        round of them and the verdict after it."""
        self.edges_share = 0  # this stage's trials are now the budget's to spend
        candidates = [inc.knobs, *(replace(inc.knobs, edges=e) for e in self.edge_sets)]  # distinct sets
        if not inc.knobs.batching:
            return inc, []
        if self.budget_left < len(candidates) + self.rules.runs:
            self.log(f"== bucket edges: not tuned, {self.budget_left} trials left for {len(candidates)} edge sets")
            return inc, []
        return self._halved(inc, candidates, "edges", " (requests padded up to each set's edges)")

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
        written = tuning.best.knobs
        # of configs that held the same rate, the one written is the best measured: a tie is no reason
        k, rate = max(self.held.items(), key=lambda x: (x[1], x[0].schedule == written.schedule))
        tuning.best_measured = (k.label(), round(rate, 1))
        if k.schedule != written.schedule and not tuning.differs_because:
            # the written config's own best verdict, whatever queue policy it carries now
            mine = held(self, written) or tuning.best.rate or 0.0
            tuning.differs_because = (
                f"{k.label()} held {rate:.0f} req/s once, {written.label()} {mine:.0f}: "
                + ("within one rung, the search's resolution" if rate <= mine * self.rules.rate_step * 1.001 else
                   "it did not win its side-by-side runs"))
