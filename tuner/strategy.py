"""One search loop: a strategy proposes candidates and learns from their results (ask and tell).

The loop is the one every search here runs: ask the strategy for a candidate, measure it, tell
the strategy the result, until the strategy has nothing left to propose or the budget is spent.
What a candidate is, how it is measured, and what a result says are the caller's: the offline
tuner's candidates are knobs measured against the incumbent (`Search.challenge`), the traffic
mix's are joint configs measured at the rung above the incumbent's scale (`MixSearch`), the
tuner bench's grid screens every config (`benchmarks/tuner_bench.py`), the judge's rounds walk
every entrant in turn (`benchmarks/judge.py`, `JudgeRound`; the mix bench's judge too), the
gateway's in-flight limit bisects closed loops (`tuner/in_flight.py`). Each walks a candidate's
rates along the one ladder walk (`tuner/ladder.py`); the searches decide each rate by the one
verdict (`tuner/noise.py`, `settle`), the grid's screening by one run per rate, as a brute-force
search does.

The shape is that of Optuna's ask-and-tell and Ray Tune's Searcher: the strategy never measures,
so a strategy can be read, and tested, without a server.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Generic, Protocol, TypeVar

C = TypeVar("C")  # a candidate
R = TypeVar("R")  # what measuring one says


class Strategy(Protocol[C, R]):
    def ask(self) -> C | None:
        """The next candidate to measure; None: nothing left to propose."""

    def tell(self, candidate: C, result: R | None) -> None:
        """What measuring `candidate` said (None: it did not win, or measured nothing)."""


def drive(strategy: Strategy[C, R], measure: Callable[[C], R | None], can_measure: Callable[[], bool]) -> bool:
    """Ask, measure, tell, while `can_measure()` says the budget allows another candidate. True
    when the strategy ran out of candidates, False when the budget ran out first."""
    while True:
        if not can_measure():
            return False
        candidate = strategy.ask()
        if candidate is None:
            return True
        strategy.tell(candidate, measure(candidate))


class HillClimb(Generic[C, R]):
    """From an incumbent, one move at a time in the order `moves(incumbent, result)` gives them;
    the first move whose result is not None becomes the incumbent, and its own moves come next.
    No candidate is proposed twice (by `key`). Done when the incumbent has no untried move left."""

    def __init__(self, incumbent: C, result: R, moves: Callable[[C, R], Iterable[C]],
                 key: Callable[[C], Hashable] = lambda c: c, tried: Iterable[C] = ()):
        self.incumbent, self.result, self.moves, self.key = incumbent, result, moves, key
        self.tried = {key(c) for c in (incumbent, *tried)}
        self._pending: Iterator[C] = iter(moves(incumbent, result))

    def ask(self) -> C | None:
        for c in self._pending:
            if self.key(c) not in self.tried:
                self.tried.add(self.key(c))
                return c
        return None

    def tell(self, candidate: C, result: R | None) -> None:
        if result is not None:
            self.incumbent, self.result = candidate, result
            self._pending = iter(self.moves(candidate, result))


class EveryCandidate(Generic[C, R]):
    """Each candidate once, in order, every result kept: a brute-force grid (Model Analyzer's
    brute search, `tritonkit bench tuner`'s grid)."""

    def __init__(self, candidates: Iterable[C]):
        self._pending = iter(candidates)
        self.results: list[tuple[C, R | None]] = []

    def ask(self) -> C | None:
        return next(self._pending, None)

    def tell(self, candidate: C, result: R | None) -> None:
        self.results.append((candidate, result))
