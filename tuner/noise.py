"""How far one short measurement can be trusted on the machine at hand, and the rules that decide
with it. Near capacity, on a shared box, the P95 of one 3 s run of one config at one rate can
differ from the next run's by half; every keep/revert and every sustained rate here
therefore rests on repeated runs, judged against the measured run-to-run noise.

- The noise, `log_sd`: the standard deviation of log P95 between repeated runs of one config at one rate,
  pooled over every (config, rate) measured more than once in this tuning, shrunk toward a prior
  while few repeats exist. Log, so that it is relative: 0.2 means runs are typically 20% apart.
- A run is clear when its P95 is more than two log SDs from the target: that one run decides.
  Otherwise up to three runs at that rate, and the majority decides.
- A candidate beats the incumbent only in interleaved runs (C I I C: a machine that drifts
  linearly over the four runs hits both sides alike), when it is faster in every pair and its
  mean gain is larger than the noise of that mean.
- A search's winner replaces the start only where it beat the start beside it at the confirmation:
  the start stands where it was clearly faster in most of the pairs there, or on a tie where it
  held as much on its own (`start_stands`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TypeVar

from tritonkit.tuner.rules import RULES, Rules


@dataclass
class Noise:
    """Log P95s of the runs measured so far, grouped by what was measured (config and rate)."""

    runs: dict[Hashable, list[float]] = field(default_factory=dict)
    rules: Rules = RULES

    def observe(self, key: Hashable, p95_ms: float | None) -> None:
        if p95_ms is not None and p95_ms > 0 and math.isfinite(p95_ms):
            self.runs.setdefault(key, []).append(math.log(p95_ms))

    @property
    def repeats(self) -> int:
        """Degrees of freedom behind the estimate: runs beyond the first of each group."""
        return sum(len(xs) - 1 for xs in self.runs.values() if len(xs) > 1)

    @property
    def log_sd(self) -> float:
        ss = 0.0
        for xs in self.runs.values():
            if len(xs) > 1:
                m = sum(xs) / len(xs)
                ss += sum((x - m) ** 2 for x in xs)
        r = self.rules
        pooled_var = (r.prior_weight * r.prior_log_sd ** 2 + ss) / (r.prior_weight + self.repeats)
        return max(r.min_log_sd, math.sqrt(pooled_var))

    def typical(self, key: Hashable) -> float | None:
        """The median P95 measured for `key`, None when never measured."""
        xs = self.runs.get(key)
        return math.exp(statistics.median(xs)) if xs else None


def clear(p95_ms: float | None, passed: bool, target_ms: float, log_sd: float, rules: Rules = RULES) -> bool:
    """Does one run decide its rate? A fail with no latency or too many errors does; otherwise a
    P95 more than `rules.clear` log SDs from the target, on the side its verdict says."""
    if p95_ms is None or not math.isfinite(p95_ms):
        return not passed
    distance = math.log(p95_ms / target_ms)
    return distance < -rules.clear * log_sd if passed else distance > rules.clear * log_sd


def clear_wins(pairs: list[tuple[float, float]], log_sd: float, rules: Rules = RULES) -> tuple[int, int]:
    """In how many interleaved pairs of P95s, (a, b), each side was clearly faster: (a's, b's). A pair
    counts only when its two P95s are more than `rules.clear` SDs of their difference apart (each
    run is noisy: √2 log SDs); a run that failed outright (inf) loses to one that did not, and two
    such runs decide nothing."""
    a_wins = b_wins = 0
    for a, b in pairs:
        if math.isinf(a) or math.isinf(b):
            if math.isinf(a) != math.isinf(b):
                a_wins, b_wins = a_wins + math.isinf(b), b_wins + math.isinf(a)
            continue
        gap = math.log(b / a)
        if abs(gap) > rules.clear * math.sqrt(2) * log_sd:
            a_wins, b_wins = a_wins + (gap > 0), b_wins + (gap < 0)
    return a_wins, b_wins


def start_stands(pairs: list[tuple[float, float]], log_sd: float, start_held: float, winner_held: float,
                 rules: Rules = RULES) -> bool:
    """Whether the start, not the search's winner, is what to write, from the confirmation's pairs
    beside it, (winner P95, start P95), and the highest rate each held by a verdict on its own. The
    winner beat the start side by side before (the screen's rounds, the climb's pairs), so the two
    sides are not alike here:
    - the winner stands where it was clearly faster in more pairs than the start (`clear_wins`);
    - the start stands on clear pairs only where it was clearly faster in most of all the pairs: one
      clear pair among runs within the noise can be a burst on the box (a run ten times its others),
      and one run does not undo the side-by-side win;
    - otherwise it is a tie within the noise, and the start stands where it was no slower in most
      pairs and held at least the winner's rate itself (a screen run the winner passed by luck, then
      walked down from, is no evidence against a start that held more)."""
    winner_clearly, start_clearly = clear_wins(pairs, log_sd, rules)
    if winner_clearly > start_clearly:
        return False
    if start_clearly > winner_clearly and 2 * start_clearly > len(pairs):
        return True
    start_as_fast = sum(s <= w for w, s in pairs)
    return 2 * start_as_fast > len(pairs) and start_held >= winner_held


def majority(verdicts: list[bool], rules: Rules = RULES, final: bool = False) -> bool | None:
    """True or False once a majority of `rules.runs` runs agree; None while undecided. `final`: no
    budget is left for another run, so the runs so far decide (a tie fails)."""
    passes = sum(verdicts)
    if passes > rules.runs // 2:
        return True
    if len(verdicts) - passes > rules.runs // 2:
        return False
    return 2 * passes > len(verdicts) if final else None


T = TypeVar("T")  # one run, as the caller measures it


def settle(measure: Callable[[], T], held: Callable[[T], bool], more: Callable[[], bool],
           is_clear: Callable[[T], bool] = lambda run: False, runs: list[T] | None = None,
           rules: Rules = RULES) -> tuple[bool, list[T]]:
    """The one verdict at one rate: hold or miss, and the runs behind it. A first run that
    `is_clear` decides alone; otherwise runs until a majority of `rules.runs` agrees; once `more()`
    says the budget is spent, the runs so far decide (a tie misses). `runs`: runs already made there."""
    runs = list(runs or [])
    while True:
        if runs:
            verdicts = [held(r) for r in runs]
            verdict = majority(verdicts, rules)
            if verdict is None and len(runs) == 1 and is_clear(runs[0]):
                verdict = verdicts[0]
            if verdict is None and not more():
                verdict = majority(verdicts, rules, final=True)
            if verdict is not None:
                return verdict, runs
        runs.append(measure())


def wins(pairs: list[tuple[float, float]], log_sd: float, rules: Rules = RULES) -> bool:
    """(candidate P95, incumbent P95) of runs measured next to each other (math.inf: the run
    failed). The candidate wins when it is faster in every pair and its mean log gain exceeds
    `rules.z` standard errors of a mean of paired differences (each pair: two runs of `log_sd`)."""
    if not pairs or any(not math.isfinite(c) for c, _ in pairs):
        return False
    gains = [math.log(i / c) if math.isfinite(i) else math.inf for c, i in pairs]
    needed = max(rules.min_gain, rules.z * log_sd * math.sqrt(2 / len(pairs)))
    return all(g > 0 for g in gains) and sum(gains) / len(gains) > needed
