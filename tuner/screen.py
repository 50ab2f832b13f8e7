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
    round: int = 0
    seen: dict[Knobs, dict[float, list[Seen]]] = field(default_factory=dict)
    finalists: list[Finalist] = field(default_factory=list)
    _queue: list[Knobs] = field(default_factory=list)
    _field: list[Knobs] = field(default_factory=list)
    _rates: list[float] = field(default_factory=list)  # the rates of the rounds before this one
    done: bool = False

    def __post_init__(self):
        self._field = list(dict.fromkeys(self.candidates))
        self._queue = list(self._field)

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

    def _score(self, k: Knobs) -> float:
        """Log P95 at the round's rate; for a fixed rate, the mean over every round so far."""
        runs = self.seen[k][self.rate] if self.fixed_rate else self.seen[k][self.rate][-1:]
        return sum(math.log(max(r.p95_ms, 1e-9)) for r in runs) / len(runs)

    def _held(self, k: Knobs) -> bool:
        runs = self.seen[k][self.rate]
        return 2 * sum(r.held for r in runs) > len(runs) if self.fixed_rate else runs[-1].held

    def _measured(self, ks: list[Knobs]) -> list[Knobs]:
        return [k for k in ks if self.rate in self.seen.get(k, {})]

    def _next_round(self) -> None:
        ranked = sorted(self._field, key=self._score)
        held = [k for k in ranked if self._held(k)]
        n = self.rules.screen_finalists
        if len(held) <= n:
            self._finish(ranked)
            return
        keep = max(n, math.ceil(len(self._field) * self.rules.screen_keep))
        self._field = held[:keep]
        self.round += 1
        if not self.fixed_rate:
            self._rates.append(self.rate)
            self.rate *= self.rules.screen_raise
        # the opposite order each round: a machine that drifts over a round hits both ends alike
        self._queue = list(reversed(self._field)) if self.round % 2 else list(self._field)

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
        before = self.seen[k][self._rates[-1]][-1:]
        return True, math.log(max(before[0].p95_ms, 1e-9))

    def held_rate(self, k: Knobs) -> float | None:
        """The highest rate `k` held in the screen (for a fixed rate: that rate, if it held there)."""
        rates = [r for r, runs in self.seen.get(k, {}).items()
                 if (2 * sum(x.held for x in runs) > len(runs) if self.fixed_rate else runs[-1].held)]
        return max(rates) if rates else None
