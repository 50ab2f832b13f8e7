"""Measuring a candidate and judging it against the noise of the machine at hand (tuner/noise.py):
the trial budget, one run at a rate, the verdict there (one clear run, else the majority of three),
a candidate's sustained rate along the one ladder walk (tuner/ladder.py), and the paired comparison
that decides whether a candidate beats an incumbent. The offline search builds on it
(tuner/offline.py); the end of a search reads its budget and its P95 rule (tuner/confirm.py).

A sustained rate is the highest rate on the ladder (steps of `Rules.rate_step`) that holds in most
runs: one run decides a rate only when its P95 is far (two log SDs of the noise) from the target,
else the majority of up to three. Every trial must meet the target, the SLO less a margin
(`Objective.margin`), so that the written config still meets the SLO on a bad minute.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from tritonkit.tuner.confirm import pairs_text
from tritonkit.tuner.costmodel import CostModel
from tritonkit.tuner.knobs import Knobs
from tritonkit.tuner.ladder import walk_down, walk_up
from tritonkit.tuner.noise import Noise, clear, settle, wins
from tritonkit.tuner.objective import Objective, Score
from tritonkit.tuner.predict import start_rate
from tritonkit.tuner.rules import RULES, Rules
from tritonkit.tuner.trials import Trial, Trials


class Rates:
    """A candidate measured at rates and judged: the budget, one run, the verdict at a rate, a
    candidate's sustained rate along the ladder walk, and the paired comparison with an incumbent."""

    def __init__(self, trials: Trials, objective: Objective, max_trials: int, log: Callable[[str], None],
                 rules: Rules = RULES):
        self.t, self.obj, self.max_trials, self.log, self.rules = trials, objective, max_trials, log, rules
        self.noise = Noise(rules=rules)
        self.cm: CostModel | None = None  # the calibration's: where rate searches start
        # the most the calibration's closed loop got through: no open-loop rate above it is offered
        # first, as the client and the server share the machine (`Rules.ceiling`)
        self.ceiling = 0.0  # 0: not calibrated
        self.held: dict[Knobs, float] = {}  # the highest rate each config held by a verdict
        self.predicts = True  # False: the calibration's fit cannot rank, so no walk starts from it

    @property
    def budget_left(self) -> int:
        """Trials the search may still use; the last few are kept for the overload check and the
        confirmation, so that `max_trials` is never exceeded."""
        return self.max_trials - len(self.t.trials) - self.reserved

    @property
    def reserved(self) -> int:
        """Trials kept for the end: the overload checks and the confirmation (a fixed target rate
        is confirmed at that rate only: one rate's runs with the start beside them)."""
        r = self.rules
        return r.final_trials - r.rate_trials if self.obj.rps else r.final_trials

    @property
    def final_left(self) -> int:
        return self.max_trials - len(self.t.trials)

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
        if not ok:  # its trial a run that missed: a tie of a miss and a hold is no pass
            return Score(k, -math.inf, None, next((r for r in reversed(runs) if not r.passed), runs[-1]), runs)
        passing = sorted((r for r in runs if r.passed), key=self.p95)
        return Score(k, statistics.median(r.ok_rps for r in passing), rate, passing[len(passing) // 2], runs)

    # -- evaluating one candidate ---------------------------------------------------------------

    def evaluate(self, k: Knobs, phase: str, start_rate: float | None = None) -> Score:
        if self.obj.rps:
            ok, runs = self.verdict_at(k, self.obj.rps, phase)
            return self._score(k, self.obj.rps, runs, ok)
        return self.sustained(k, start_rate or 100.0, phase)

    def sustained(self, k: Knobs, rate: float, phase: str, given: list[Trial] | None = None,
                  prior: list[Trial] | None = None) -> Score:
        """The highest rate that holds in most runs, to within one rung (`Rules.rate_step`), along
        the one ladder walk (`tuner/ladder.py`). From a `rate` that holds, the edge is bracketed
        (first at the rate the cost model predicts `k` sustains, `start_rate`) and bisected. From a
        `rate` that misses, it steps down a rung at a time; one failed run per rung is enough there
        (a rung too low costs the figure one rung), and the first pass must hold in most runs.
        `given`: runs at `rate` that already held there; `prior`: runs there the verdict counts in."""
        ok, runs = (True, given) if given else self.verdict_at(k, rate, phase, prior)
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
            predicted = self.start_rate(k) if self.cm and self.predicts else None
            top, _ = walk_up(rate, holds, self.rules.rate_step, more, predicted)
        else:
            top = walk_down(rate, holds_below, self.rules.rate_step, more, self.rules.max_steps_down)
        return scores[rate if top is None else top]

    def challenge(self, inc: Score, k: Knobs, phase: str = "neighbour") -> Score | None:
        """`k`'s score when it beats the incumbent, else None.

        Against an incumbent that misses the target, a candidate that holds it wins outright. For
        the most throughput, a candidate wins when it holds the rung above the incumbent's sustained
        rate, where the incumbent stopped holding (by the verdict's noise rule: one clear run, else
        the majority of three), then beats the incumbent run there again beside it (I C), and
        climbs to its own sustained rate. For the lowest P95 at a rate: one screening run there; a
        candidate not faster than the incumbent typically is costs that run only. Otherwise the
        incumbent twice and the candidate again (C I I C): a drift of the machine over the four
        runs hits both sides alike, and the candidate must win both pairs by more than the noise
        (noise.wins) and hold the target in both of its runs."""
        c0 = None
        if not inc.passed:  # the incumbent misses the target: a candidate that holds is better outright
            s = self.evaluate(k, phase, self.start_rate(k))
            if s.passed or not self.obj.rps:
                return s if s.passed else None
            c0 = s.runs[-1]  # neither holds the target rate: their P95s there decide, as below
        if not self.obj.rps:
            if self.budget_left < self.rules.runs:  # a verdict it could not finish would be wasted
                return None
            above = inc.rate * self.rules.rate_step
            ok, runs = self.verdict_at(k, above, phase)
            if ok and self.budget_left < 2:
                # a hold minutes after the incumbent's miss is no comparison: without the pair
                # beside it, nothing is decided and the incumbent stays
                self.log(f"    undecided: it holds {above:.0f} req/s, and no trials are left to run it beside "
                         f"the incumbent there")
                return None
            if ok:
                # held where the incumbent stopped, minutes later: the incumbent there again, beside
                # it (I C), decides whether it is faster or the machine was
                i, c = self.measure(inc.knobs, above, "incumbent"), self.measure(k, above, phase)
                runs.append(c)
                ok = c.passed and self.p95(c) < self.p95(i)
                pair = pairs_text([(self.p95(c), self.p95(i))])
                self.log(f"    beside the incumbent at {above:.0f} req/s: P95 {pair} ms")
            self.log(f"    {'won' if ok else 'lost'}: {'holds' if ok else 'misses'} {above:.0f} req/s, the rung "
                     f"above the incumbent's {inc.rate:.0f}")
            return self.sustained(k, above, phase, given=[r for r in runs if r.passed]) if ok else None
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
        self.log(f"    {'won' if won else 'lost'}: P95 {pairs_text(pairs)} ms against the incumbent's; "
                 f"noise {self.noise.log_sd:.2f}")
        return self._score(k, rate, [c0, c1], held) if won else None

    def start_rate(self, k: Knobs) -> float:
        """Where `k`'s rate search starts (tuner/predict.py), within what the calibration got through."""
        return start_rate(self.cm, k, self.obj, self.ceiling, self.rules)


def _key(k: Knobs, rate: float) -> tuple[str, float]:
    """What repeated runs share: the config and the rate (the label covers every knob)."""
    return k.label(), round(rate, 1)
