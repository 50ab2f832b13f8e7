"""The broad screen: every config of a small space measured briefly, side by side, the field
narrowed round by round (successive halving, as Hyperband and Optuna's pruners do it).

On a small box the space is 10 to 30 configs (batch sizes on the ladder x instance counts). A
one-knob climb from the user's start sees only its neighbours, and one noisy rung can stop it
before it reaches a corner of the space; a cost model fitted on a saturated box can rank every
config at zero. The screen needs neither: every config runs once at the first round's rate, in
one pass, so that a slow minute of the machine hits them alike; the configs that held there, best
P95 first, go on to a rate two rungs higher, in the opposite order (A B ... B A), and so on, until
no more than the finalists hold, or none does. Each round ranks by P95 at one rate measured in
the same minutes: a comparison, never a threshold, decides who goes on. A finalist that missed
the last round is still handed on beside the one that held, so that one losing run does not
drop the runner-up; those that missed it are ranked by the round before, which they all held.

Where the misses of a round decide who goes on (fewer held than the round keeps), the configs
that missed run once more at that rate, in the opposite order, and each counts by the better of
its runs. A miss is either the config's edge or a neighbour's burst, and a burst only ever slows
a run: on a shared box a config is as fast as its best run shows, and one run that met a burst
must not drop the config that is fastest in the quiet seconds. As many run again as there are
places left: in a raised round the fastest the round before (which all held) first; in the first
round those the cost model ranks fastest (`prior`), since a config past its edge is what the
model predicts to miss, and a burst is not; with no model that predicts, the least slow there.
The refinement and the confirmation that follow judge the finalists on full runs.

For a fixed target rate (the lowest P95 there) every round runs at that rate and ranks by the mean
log P95 of the rounds so far.

A strategy in the ask-and-tell shape of `tuner/strategy.py`: it never measures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tritonkit.tuner.knobs import Knobs
from tritonkit.tuner.rules import RULES, Rules


@dataclass(frozen=True)
class Seen:
    """One screening run: its P95 (math.inf when it failed outright) and whether it held the target."""

    p95_ms: float
    held: bool


@dataclass
class Finalist:
    knobs: Knobs
    rate: float | None  # the highest rate it held in the screen (None: it held none)


@dataclass
class Halving:
    candidates: list[Knobs]
    rate: float  # the first round's
    fixed_rate: bool = False  # the lowest P95 at one rate: every round there
    rules: Rules = RULES
    prior: dict[Knobs, float] = field(default_factory=dict)  # the cost model's ranking, higher first
    round: int = 0
    seen: dict[Knobs, dict[float, list[Seen]]] = field(default_factory=dict)
    finalists: list[Finalist] = field(default_factory=list)
    _queue: list[Knobs] = field(default_factory=list)
    _field: list[Knobs] = field(default_factory=list)
    _rates: list[float] = field(default_factory=list)  # the rates of the rounds before this one
    done: bool = False

    def __post_init__(self):
        self._field = list(dict.fromkeys(self.candidates))
        self._queue = self._pass_order()

    def ask(self) -> tuple[Knobs, float] | None:
        if self.done or not self._queue:
            return None
        return self._queue[0], self.rate

    def tell(self, candidate: tuple[Knobs, float], result: Seen | None) -> None:
        k, rate = candidate
        self._queue.remove(k)
        self.seen.setdefault(k, {}).setdefault(rate, []).append(result or Seen(math.inf, False))
        if not self._queue:
            self._next_round()

    def stop(self) -> None:
        """The budget ran out mid-round: the field as measured so far decides, those measured in
        this round first; a round that measured none is judged at the last round's rate."""
        if self.done:
            return
        measured = self._measured(self._field)
        if not measured and self._rates:
            self.rate = self._rates[-1]
            measured = self._field
        self._finish(measured, [k for k in self._field if k not in measured])

    # -- between rounds ----------------------------------------------------------------------------

    def _score(self, k: Knobs, rate: float | None = None) -> float:
        """Log P95 at the round's rate, of its best run there; for a fixed rate, the mean over every
        round so far."""
        runs = self.seen[k][self.rate if rate is None else rate]
        logs = [math.log(max(r.p95_ms, 1e-9)) for r in runs]
        return sum(logs) / len(logs) if self.fixed_rate else min(logs)

    def _held_at(self, k: Knobs, rate: float) -> bool:
        """In most runs at a fixed rate; at a raised rate, in any (a burst only ever slows a run)."""
        runs = self.seen.get(k, {}).get(rate, [])
        return 2 * sum(r.held for r in runs) > len(runs) if self.fixed_rate else any(r.held for r in runs)

    def _held(self, k: Knobs) -> bool:
        return self._held_at(k, self.rate)

    def _measured(self, ks: list[Knobs]) -> list[Knobs]:
        return [k for k in ks if self.rate in self.seen.get(k, {})]

    def _next_round(self) -> None:
        ranked = sorted(self._field, key=self._score)
        held = [k for k in ranked if self._held(k)]
        n = self.rules.screen_finalists
        keep = max(n, math.ceil(len(self._field) * self.rules.screen_keep))
        if again := self._again(held, keep):
            self._queue = [k for k in reversed(self._pass_order()) if k in again]  # the last to run goes first
            return
        if len(held) <= n:
            self._finish(ranked)
            return
        self._field = held[:keep]
        self.round += 1
        if not self.fixed_rate:
            self._rates.append(self.rate)
            self.rate *= self.rules.screen_raise
        self._queue = self._pass_order()

    def _pass_order(self) -> list[Knobs]:
        """The field in the opposite order each round: a machine that drifts over a round hits both
        ends alike."""
        return list(reversed(self._field)) if self.round % 2 else list(self._field)

    def _again(self, held: list[Knobs], keep: int) -> set[Knobs]:
        """The misses that run once more: as many as there are places left in the next round's
        field, in the order the module says. None at a fixed rate (a majority of runs decides
        there), none twice, and none where the field goes on whole to the finalists."""
        if self.fixed_rate or len(held) >= keep or len(self._field) <= self.rules.screen_finalists:
            return set()
        if any(len(self.seen[k][self.rate]) > 1 for k in self._field):
            return set()  # this round's second runs are done
        missed = sorted((k for k in self._field if not self._held(k)), key=self._retry_key)
        return set(missed[:keep - len(held)])

    def _retry_key(self, k: Knobs) -> float:
        if self._rates:
            return self._score(k, self._rates[-1])
        if self.prior:
            return -self.prior.get(k, -math.inf)
        return self._score(k)

    def _finish(self, ranked: list[Knobs], unmeasured: list[Knobs] = ()) -> None:
        """The finalists: those that held the last round, best first, then the best of the rest
        (then any the budget left unmeasured in it)."""
        ranked = sorted(ranked, key=self._final_key)
        self.finalists = [Finalist(k, self.held_rate(k)) for k in [*ranked, *unmeasured][:self.rules.screen_finalists]]
        self.done = True

    def _final_key(self, k: Knobs) -> tuple[bool, float]:
        """Those that held the last round by their P95 there; the rest by their P95 the round
        before, where every one of them held: a raised rate that a config missed is past its edge,
        where its P95 says how fast its queue grew in a few seconds, and one noisy run there ranks
        a config that had been several times faster below it (the first round has no round before)."""
        if self._held(k) or self.fixed_rate or not self._rates:
            return not self._held(k), self._score(k)
        return True, self._score(k, self._rates[-1])

    def held_rate(self, k: Knobs) -> float | None:
        """The highest rate `k` held in the screen (for a fixed rate: that rate, if it held there)."""
        rates = [r for r in self.seen.get(k, {}) if self._held_at(k, r)]
        return max(rates) if rates else None
