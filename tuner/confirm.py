"""The end of a search: the queue policy that protects the SLO, checked under overload, and the
winner measured again, its runs pooled, with the start beside it (tuner/pooled.py), stepping its
rate down until it holds (`ladder.down_from`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from tritonkit.configs.gateway import drops_queue_policies
from tritonkit.server_traits import ServerTraits
from tritonkit.tuner.costmodel import CostModel
from tritonkit.tuner.knobs import Knobs
from tritonkit.tuner.ladder import down_from
from tritonkit.tuner.noise import Noise, clear_wins, majority, start_stands
from tritonkit.tuner.objective import Objective, Score, Tuning
from tritonkit.tuner.pooled import pooled, pooled_verdict
from tritonkit.tuner.protect import Budget, classes_for, measured_overhead_ms, overload_holds, protect, tightened
from tritonkit.tuner.rules import RULES, Rules
from tritonkit.tuner.trials import Trial, Trials


class Search(Protocol):
    """What the end of a search reads of it (tuner/offline.py)."""

    t: Trials
    obj: Objective
    rules: Rules
    traits: ServerTraits | None
    log: Callable[[str], None]
    noise: Noise  # the run-to-run noise measured so far
    held: dict[Knobs, float]  # the highest rate each config held by a verdict

    @property
    def final_left(self) -> int: ...  # trials left in the whole budget

    @property
    def reserved(self) -> int: ...  # trials the overload check leaves for the confirmation

    def p95(self, t: Trial) -> float: ...  # the P95 a comparison uses (math.inf for a failed run)


def protect_and_confirm(search: Search, tuning: Tuning, cm: CostModel) -> None:
    """Add the queue policy that protects the SLO, check it under overload, then measure the
    winner again; a rate that does not hold on the second run steps down until one does."""
    best = tuning.best
    k = best.knobs
    if search.obj.rps:
        rate, capacity = search.obj.rps, cm.capacity(k.items, k.instances)
    else:
        rate = capacity = best.rate or 0.0
    candidates = [k]
    if k.batching and drops_queue_policies(search.t.spec):
        tuning.policy_note = "no queue policy: behind the gateway, Envoy refuses what is over its limit"
        search.log(f"   {tuning.policy_note}")
    elif k.batching:  # a queue policy is part of dynamic batching: none without a batch axis
        protected = _protected(search, tuning, k, cm, capacity)
        if protected is not None:
            candidates.insert(0, protected)
        if tuning.policy_note:
            search.log(f"   {tuning.policy_note}")
    search.log(f"== confirm: three runs, pooled, must meet the SLO itself ({search.obj.p95_ms:g} ms); "
               "pass/fail below is each run's against the search's target")
    # down the ladder as far as the trials left allow: a box that slowed after the search may
    # hold only several rungs down, and trials kept for the end are worth spending on it
    beside = None if tuning.kept else tuning.baseline.knobs
    c = confirm(search.t, candidates, rate, step_down=not search.obj.rps,
                limit=search.final_left, objective=search.obj, rules=search.rules, beside=beside)
    confirmed = c.score
    tuning.beside_start = [(search.p95(w), search.p95(b)) for w, b in c.pairs]
    if confirmed is not None:
        tuning.best, tuning.confirmed = confirmed, True
        if confirmed.knobs.instances != best.knobs.instances:
            tuning.differs_because = (f"{best.knobs.label()} won the search; its protective queue policy runs "
                                      f"{confirmed.knobs.instances} instances, as the probe found a bounded queue "
                                      "stalls the batcher on fewer")
    if confirmed is None and not best.passed and c.partial is None:
        # a finalist unsettled by its walk (offline.py `_unsettled`) is written only where it holds
        tuning.best, tuning.differs_because = tuning.baseline, ""
        tuning.beside_why = f"{best.knobs.label()} held at no rate of its confirmation"
        search.log(f"  {tuning.beside_why}: the start stands")
        return
    if c.pairs:
        _settle_beside(search, tuning, best.knobs, c)
    if confirmed is None and (c.failed_at or c.partial) and not tuning.start_stands_beside:
        _claim_what_held(search, tuning, c)


def _settle_beside(search: Search, tuning: Tuning, winner: Knobs, c: Confirmation) -> None:
    """Whether the winner beat the start in the pairs beside it (`noise.start_stands`); where it did
    not, the start is what is written."""
    start_held = held(search, tuning.baseline.knobs)
    measured_again = c.score or c.partial
    winner_held = max(held(search, winner), (measured_again.rate or 0.0) if measured_again else 0.0)
    tuning.start_stands_beside = start_stands(tuning.beside_start, search.noise.log_sd, start_held, winner_held,
                                              search.rules)
    winner_clearly, start_clearly = clear_wins(tuning.beside_start, search.noise.log_sd, search.rules)
    n = len(tuning.beside_start)
    why = f"beside the start at the confirmation, {winner.label()} was the faster in {winner_clearly} of {n} pairs " \
          f"and the start in {start_clearly}, out of the noise"
    if winner_clearly <= start_clearly:
        why += f"; the start held {start_held:.0f} req/s on its own, {winner.label()} {winner_held:.0f}"
    tuning.beside_why = why
    search.log(f"  beside the start: P95 {pairs_text(tuning.beside_start)} ms: {why}; "
               + ("the start stands" if tuning.start_stands_beside else "the winner stands"))
    if tuning.start_stands_beside:
        # no paired evidence that the winner beat the start: never write a change it did not earn
        tuning.best, tuning.confirmed, tuning.differs_because = tuning.baseline, False, ""


def held(search: Search, k: Knobs) -> float:
    """The highest rate a config batching as `k` does held by a verdict in this search, 0 if none."""
    return max((r for x, r in search.held.items() if x.schedule == k.schedule), default=0.0)


def lower_and_confirm(search: Search, tuning: Tuning) -> None:
    """Nothing held within the search's budget: the trials kept for the overload check and the
    confirmation go on stepping the spec's own config down from the lowest rate it was run at,
    by the confirmation's rule, so that a slow minute early on still ends in a measured figure."""
    k = tuning.baseline.knobs
    rates = [t.rate for t in search.t.trials if t.label == k.label() and t.rate]
    if not rates or search.final_left <= 0:
        return
    search.log(f"== nothing held the target within the search; the spec's own config from "
               f"{min(rates) / search.rules.rate_step:.0f} req/s down, three pooled runs at the SLO itself")
    confirmed = confirm(search.t, [k], min(rates) / search.rules.rate_step, step_down=True,
                        limit=search.final_left, objective=search.obj, rules=search.rules).score
    if confirmed is not None:
        tuning.best, tuning.confirmed = confirmed, True
        tuning.policy_note = "no protective queue policy was derived: nothing held the target within the search"


def _protected(search: Search, tuning: Tuning, k: Knobs, cm: CostModel, capacity: float) -> Knobs | None:
    """The winner with a protective policy that held at every overload factor, or None (and why)."""
    b = search.t.spec.model(search.t.model).batching
    budget = Budget(search.obj.p95_ms, cm.t_ms(k.items), measured_overhead_ms(search.t.trials))
    candidate, why = protect(k, b, budget, capacity, search.traits, search.rules)
    search.log(f"== queue policy for the winner: {why}")
    if candidate is None:
        tuning.policy_note = why
        return None
    for attempt in (candidate, tightened(candidate)):
        if search.final_left < search.reserved:
            break  # the confirmation's trials stay reserved
        search.log(f"   overload check of {attempt.label()} at "
                   f"{', '.join(f'{f:g}x' for f in search.rules.overload_factors)} {capacity:.0f} req/s")
        held = True
        for factor in search.rules.overload_factors:
            check = search.t.run(attempt, search.t.open_load(factor * capacity), "overload", classes_for(b))
            tuning.overload.append(check)
            held = overload_holds(check, capacity, search.obj.p95_ms, search.rules.overload_goodput)
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
                          f"{search.rules.overload_goodput:.0%} of "
                          f"{capacity:.0f} req/s within {search.obj.p95_ms:g} ms; the winner is written "
                          f"without it")
    return None


def _claim_what_held(search: Search, tuning: Tuning, c: Confirmation) -> None:
    """The trials ran out before any rate was confirmed: the winner's claim is never a rate its
    confirmation missed, nor the search's figure. It is the rate whose runs so far, pooled, met the
    SLO, or none."""
    if c.partial is not None:
        r, n = c.partial.rate or 0.0, len(c.partial.runs)
        tuning.best = c.partial
        tuning.claim_note = (f"claimed at {r:.0f} req/s, where its {n} run{'s' if n > 1 else ''} so far, pooled, met "
                             f"the SLO; the trials ran out before the {search.rules.runs} a confirmation pools"
                             + (f", and it missed at {_rates(c.failed_at)} req/s" if c.failed_at else ""))
    else:  # the figure stays the search's, which the report shows as not confirmed
        tuning.best = replace(tuning.best, rate=None)
        tuning.claim_note = (f"no claim: it missed its confirmation at {_rates(c.failed_at)} req/s and the "
                             "trials ran out before a lower rate was measured")
    search.log(f"  {tuning.claim_note}")


def _rates(rates: list[float]) -> str:
    return ", ".join(f"{r:.0f}" for r in rates)


@dataclass
class Confirmation:
    score: Score | None  # the first candidate confirmed; None where none held
    pairs: list[tuple[Trial, Trial]] = field(default_factory=list)  # (a candidate's run, the start's beside it)
    failed_at: list[float] = field(default_factory=list)  # the rates where every candidate's verdict failed
    # where the trials ran out mid-verdict: the runs so far at that rate, pooled, where they meet the SLO
    partial: Score | None = None


def confirm(trials: Trials, candidates: list[Knobs], rate: float, step_down: bool, objective: Objective,
            limit: int | None = None, rules: Rules = RULES, beside: Knobs | None = None) -> Confirmation:
    """Measure again at `rate`: a candidate is confirmed where its runs, pooled, meet the SLO itself
    (`held`; the search aimed at the SLO less the margin), and the first one confirmed wins (later
    ones are fallbacks). A rate that does not hold steps down, `rules.max_steps_down` rates at most
    (the tuner's and the bench grid's winners alike); a fixed target rate is the only rate tried.
    At most `limit` trials. `beside`: the start, run after a candidate's first run at the claimed rate
    and between its runs wherever its verdict is open (W S W S W), each pair kept: whether the winner
    beat the start is decided in the same minutes, whatever rate it holds."""
    end = len(trials.trials) + (limit if limit is not None else rules.max_steps_down * rules.runs * len(candidates))
    c = Confirmation(None)

    def more() -> bool:
        return len(trials.trials) < end

    def holds(r: float) -> bool:
        for k in candidates:
            runs: list[Trial] = []
            while True:
                verdict = confirmation_verdict(runs, objective, rules)
                if runs and beside is not None and more() and (verdict is None or not c.pairs):
                    # the start beside the run just made: while the verdict is open, and at the claim
                    c.pairs.append((runs[-1], trials.run(beside, trials.confirm_load(r), "beside")))
                if verdict is not None or not more():
                    break
                runs.append(trials.run(k, trials.confirm_load(r), "confirm"))
            if verdict:
                c.score = _score(k, runs, r, step_down)
                return True
            if verdict is None:  # out of trials mid-verdict
                so_far = pooled(runs) if runs else None
                if so_far and objective.holds(so_far.p95_ms, so_far.error_ratio, rules.error_margin):
                    c.partial = _score(k, runs, r, step_down)
                return False
        c.failed_at.append(r)
        return False

    down_from(rate, holds, rules.rate_step, more, rules.max_steps_down if step_down else 1)
    return c


def _score(k: Knobs, runs: list[Trial], rate: float, step_down: bool) -> Score:
    p = pooled(runs, passed=True)
    return Score(k, p.ok_rps if step_down else -p.p95_ms, rate, p, runs)


def confirmation_verdict(runs: list[Trial], objective: Objective, rules: Rules = RULES) -> bool | None:
    """A confirmation's verdict at one rate: the runs pooled against the SLO, and their errors
    against `rules.error_margin` of the bound (refusals come in bursts, so three short runs within
    the whole bound promise less than a long load test meets). Without pooling,
    the majority of the runs, each against the SLO."""
    if not rules.pooled:
        return majority([objective.holds(t.p95_ms, t.error_ratio, rules.error_margin) for t in runs], rules) \
            if runs else None
    return pooled_verdict(runs, objective.p95_ms, objective.max_error_ratio * rules.error_margin, rules)


def pairs_text(pairs: list[tuple[float, float]]) -> str:
    return ", ".join(f"{c:.1f} vs {i:.1f}" for c, i in pairs)
