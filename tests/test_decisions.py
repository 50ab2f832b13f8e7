"""The decision logic of the tuner (offline search, online sidecar) and of the router, checked
without a server: a fixed cost model stands in for measurements and a fake clock for time, so
every outcome here is the same on any machine. The real-server tests check that the decisions
are carried out; these check that they are the right ones."""

from __future__ import annotations

import asyncio
import heapq
import math
import os
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from tritonkit.benchmarks.judge import JUDGE_STEP
from tritonkit.benchmarks.routing import Sent, share, switch_time
from tritonkit.clients import AsyncRouter, RouterPolicy
from tritonkit.clients.endpoint import LatencyWindow
from tritonkit.clients.errors import UnavailableError
from tritonkit.loadtests.load import Load, Sample
from tritonkit.loadtests.stalls import without_stalls
from tritonkit.server_traits import ServerTraits
from tritonkit.spec import Batching, QueuePolicy
from tritonkit.stats import relative_range
from tritonkit.tuner.confirm import confirm
from tritonkit.tuner.costmodel import CostModel
from tritonkit.tuner.knobs import Knobs, grid, powers_of_two
from tritonkit.tuner.noise import Noise, clear, clear_wins, majority, start_stands, wins
from tritonkit.tuner.objective import Objective
from tritonkit.tuner.offline import Search
from tritonkit.tuner.online import Controller, Observation, OnlineSettings
from tritonkit.tuner.pooled import pooled, pooled_verdict
from tritonkit.tuner.predict import predict_p95
from tritonkit.tuner.protect import Budget, protect
from tritonkit.tuner.rules import RULES
from tritonkit.tuner.screen import Halving, Seen
from tritonkit.tuner.settings import TuneSettings
from tritonkit.tuner.simulated import (
    MODEL_SPEC,
    SLO_MS,
    TRUE_WORLD,
    WORLD,
    WORLDS,
    SimulatedTrials,
    TrueWorldTrials,
    best_sustained,
    quick_search,
    true_edge,
    with_latencies,
)
from tritonkit.tuner.trials import Trial, TrialWindow

TRIALS = TuneSettings.max_trials  # a whole search's default budget


@pytest.fixture(autouse=True)
def two_cores(monkeypatch):
    """Instances and parallelism follow the core count: fix it, so the outcomes do not."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


# -- the offline search ------------------------------------------------------------------------


def test_offline_search_runs_its_phases_in_order_within_its_budget():
    """The mechanics, on the world that follows the cost model exactly (how near the best it gets
    on a world it misjudges is the next tests'): calibration recovers the law, the winner is no
    worse than the spec's config, and its queue policy was checked at 1.5x and 3x its rate."""
    sim = SimulatedTrials()
    spec_knobs = Knobs(16, 8000, 1)
    tuning = Search(sim, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None).run(spec_knobs)
    assert tuning.confirmed and tuning.best.passed
    assert tuning.best.rate >= tuning.baseline.rate  # never worse than the spec's own config
    assert len(sim.trials) <= TRIALS
    assert [t.phase for t in sim.trials[:4]] == ["calibrate"] * 3 + ["baseline"]
    assert tuning.cost_model.c_fixed_ms == pytest.approx(2.0) and tuning.cost_model.c_per_ms == pytest.approx(0.5)
    # the winner carries the queue policy that protects the SLO, and it was checked under overload
    assert tuning.best.knobs.queue is not None
    assert [o.rate for o in tuning.overload] == pytest.approx([1.5 * tuning.best.rate, 3 * tuning.best.rate])


@pytest.mark.parametrize("budget", [6, 9, 14])
def test_offline_search_never_exceeds_the_trial_budget(budget):
    sim = SimulatedTrials()
    Search(sim, Objective(SLO_MS), bound=16, max_trials=budget, log=lambda s: None).run(Knobs(16, 8000, 1))
    assert len(sim.trials) <= budget


@pytest.mark.parametrize("seed", [None, 3])
def test_a_model_without_a_batch_axis_is_tuned_by_its_instances_alone(seed):
    sim = TrueWorldTrials(seed)
    tuning = Search(sim, Objective(SLO_MS), bound=0, max_trials=TRIALS, log=lambda s: None).run(Knobs(0, 0, 1))
    assert tuning.confirmed and tuning.best.knobs.max_batch == 0 and tuning.best.knobs.queue is None
    assert all(t.knobs["max_batch_size"] == 0 and t.knobs["max_queue_delay_us"] == 0 for t in sim.trials)
    assert tuning.best.knobs.instances == 2  # two instances serve more than one on two cores
    assert tuning.overload == []  # no queue policy to check without dynamic batching


def test_a_queue_policy_that_collapses_under_overload_is_never_written():
    """The overload check is a gate: the same search in a world where the bounded queue collapses
    (as on Triton 2.51) confirms the winner without the policy, and says why."""
    healthy, collapsing = SimulatedTrials(), SimulatedTrials(collapses=True)
    kept = Search(healthy, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None).run(Knobs(16, 8000, 1))
    dropped = Search(collapsing, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None).run(
        Knobs(16, 8000, 1))
    assert kept.best.knobs.queue is not None and not kept.policy_note
    # under overload the collapsing queue serves a fraction of what the healthy one serves (the
    # world's rule: a fifth), which is what the gate reads
    assert kept.overload and dropped.overload
    assert max(o.ok_rps for o in dropped.overload) < 0.5 * min(o.ok_rps for o in kept.overload)
    assert dropped.confirmed and dropped.best.knobs.queue is None
    assert "failed its overload check" in dropped.policy_note
    assert dropped.best.knobs == replace(kept.best.knobs, queue=None)  # the same winner, unprotected


def test_behind_the_gateway_no_queue_policy_is_derived_and_no_trial_is_spent_on_one():
    """With the spec's gateway on, Envoy refuses the overload: the same search writes the same
    winner without a policy, runs no overload check, and says why."""
    alone = Search(SimulatedTrials(), Objective(SLO_MS), bound=16, max_trials=TRIALS,
                   log=lambda s: None).run(Knobs(16, 8000, 1))
    gated = SimulatedTrials(gateway=True)
    behind = Search(gated, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None).run(Knobs(16, 8000, 1))
    assert alone.best.knobs.queue is not None and alone.overload
    assert behind.confirmed and behind.best.knobs.queue is None and behind.overload == []
    assert not any(t.phase == "overload" for t in gated.trials) and "gateway" in behind.policy_note
    assert behind.best.knobs == replace(alone.best.knobs, queue=None)


def test_the_protective_policy_is_cut_from_measured_times_per_priority_level():
    """Queue budget = SLO - compute at the batch - overhead; interactive drains at the whole
    capacity, the default level at half; on a server whose batcher stalls behind a full queue the
    interactive level keeps only its timeout and the instances go up to what the probe found safe."""
    levels = Batching(priority_levels=2, default_priority=2)
    budget = Budget(slo_ms=25, compute_ms=10, overhead_ms=1)
    k, why = protect(Knobs(16, 2000, 1), levels, budget, capacity_rps=4000, traits=None)
    assert "queue budget 14.0 ms" in why
    assert (k.queue.max_queue_size, k.queue.default_timeout_us) == (28, 14000)  # 4000/s x 14 ms / 2
    assert [(lv, q.max_queue_size, q.default_timeout_us) for lv, q in k.level_queues] == [(1, 56, 14000)]
    assert k.instances == 1
    stalls = ServerTraits("2.51.0", stalls=True, safe_instances=2)
    k, why = protect(Knobs(16, 2000, 1), levels, budget, capacity_rps=4000, traits=stalls)
    assert k.instances == 2 and "stalls a bounded queue" in why
    assert [(lv, q.max_queue_size, q.default_timeout_us) for lv, q in k.level_queues] == [(1, 0, 14000)]
    assert k.queue.max_queue_size == 28  # bulk still turns work away at once
    # an SLO that compute and overhead already fill leaves no queue to protect
    k, why = protect(Knobs(16, 2000, 1), levels, Budget(10, 9.5, 1), capacity_rps=4000, traits=None)
    assert k is None and "leaves nothing to queue in" in why


def test_the_search_never_proposes_a_config_the_probe_found_stalling(monkeypatch):
    """On a server where a bounded queue stalls one instance (the probe), every candidate the search
    measures, and the winner, has the instances the probe found safe; the spec's own config is
    still measured as the baseline, and as the incumbent a challenger is paired with (it is the
    user's, not a proposal)."""
    from tritonkit.tuner import simulated

    # priority levels turn the batcher's prefetch off, queue policy or not: one instance stalls
    levels = Batching(priority_levels=2, default_priority=2, default_queue_policy=QueuePolicy(max_queue_size=128))
    monkeypatch.setattr(simulated, "MODEL_SPEC", MODEL_SPEC.model_copy(update={"batching": levels}))
    sim = SimulatedTrials()
    traits = ServerTraits("2.51.0", stalls=True, safe_instances=2)
    spec_knobs = Knobs(16, 8000, 1)
    search = Search(sim, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None, traits=traits)
    tuning = search.run(spec_knobs)
    proposed = [t for t in sim.trials if t.phase != "calibrate" and t.label != spec_knobs.label()]
    assert proposed and all(t.knobs["instances"] >= 2 for t in proposed), [t.label for t in proposed]
    assert any(t.phase == "baseline" and t.knobs["instances"] == 1 for t in sim.trials)
    assert tuning.confirmed and tuning.best.knobs.instances >= 2
    # where no instance count held, the tuner proposes no bounded queue at all, and says why
    k, why = protect(Knobs(16, 2000, 2), Batching(), Budget(25, 10, 1), 4000,
                     ServerTraits("2.51.0", stalls=True, safe_instances=None))
    assert k is None and "every instance count the probe tried" in why


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_latency_objective_lowers_p95_at_the_target_rate(seed):
    """The lowest P95 at 600 req/s on TRUE_WORLD, quiet and noisy (slow spells included): the
    spec's 8 ms wait is most of its P95 there, and the tuned config's is under half of it."""
    sim = TrueWorldTrials(seed)
    tuning = Search(sim, Objective(SLO_MS, rps=600), bound=16, max_trials=TRIALS, log=lambda s: None).run(
        Knobs(16, 8000, 1))
    best = _batching(tuning.best.knobs)
    assert tuning.written and tuning.best.rate == 600
    assert TRUE_WORLD.p95_ms(best, 600) < TRUE_WORLD.p95_ms(Knobs(16, 8000, 1), 600) / 2


# -- the offline search on a noisy machine --------------------------------------------------------

def _steps_apart(a: Knobs, b: Knobs) -> int:
    """How many single-knob moves of the search lie between two configs (a delay move spans up to
    two rungs down, as `neighbours` does)."""
    rung = {d: i for i, d in enumerate(RULES.delays_us)}
    delay = abs(rung[a.delay_us] - rung[b.delay_us])
    return abs(int(math.log2(a.max_batch)) - int(math.log2(b.max_batch))) + (delay + 1) // 2 + \
        abs(a.instances - b.instances)


def test_on_a_world_it_misjudges_the_search_claims_no_rate_past_the_true_edge():
    """TRUE_WORLD's law is not the cost model's (a knee, interference between instances, a heavier
    queueing tail), noise-free: the search still picks a config within two rungs of the true best
    (one for the ladder's resolution, one for the start the wrong model gives it), and claims no
    rate that config does not truly sustain."""
    sim = TrueWorldTrials()
    tuning = Search(sim, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None).run(Knobs(16, 8000, 1))
    best = max(true_edge(k) for k in grid(powers_of_two(16)))
    pick = _batching(tuning.best.knobs)
    assert tuning.confirmed and len(sim.trials) <= TRIALS
    assert true_edge(pick) >= best / RULES.rate_step ** 2, (pick.label(), true_edge(pick), best)
    assert tuning.best.rate <= true_edge(pick)


def _batching(k: Knobs) -> Knobs:
    return Knobs(k.max_batch, k.delay_us, k.instances)


def test_on_a_noisy_machine_the_picks_are_stable_and_never_claim_past_the_true_edge():
    """Twenty tunings of TRUE_WORLD, each with its own noise (15% per run, a drift, one run in ten a
    missed stall of the client) and the default 10% margin. The confirmation pools three runs at the
    SLO itself, so no confirmed rate lies past its config's true edge; the picks lie within one
    step of the most frequent one; and each pick is within three rungs of the true best (the
    ladder's resolution, the margin, and the noise the majority rule tolerates)."""
    objective = Objective(SLO_MS, margin=RULES.slo_margin)
    best = max(true_edge(k) for k in grid(powers_of_two(16)))
    picks = []
    for seed in range(20):
        sim = TrueWorldTrials(seed, objective.target_p95_ms)
        t = Search(sim, objective, bound=16, max_trials=TRIALS, log=lambda s: None).run(Knobs(16, 8000, 1))
        assert len(sim.trials) <= TRIALS
        if t.confirmed:
            picks.append((_batching(t.best.knobs), t.best.rate))
    assert len(picks) >= 18, len(picks)
    over = [(k.label(), round(r), round(true_edge(k))) for k, r in picks if r > true_edge(k)]
    assert not over, over
    common = max({k for k, _ in picks}, key=[k for k, _ in picks].count)
    assert all(_steps_apart(k, common) <= 1 for k, _ in picks), [k.label() for k, _ in picks]
    assert all(true_edge(k) >= best / RULES.rate_step ** 3 for k, _ in picks), [k.label() for k, _ in picks]


@pytest.mark.parametrize("world", sorted(WORLDS))
def test_on_a_noisy_machine_the_kit_is_at_least_as_good_as_model_analyzers_search(world):
    """Twenty tunings of each world from the config a new user writes (max batch 16, no delay, one
    instance), on a machine with slow spells (2x swings of P95 over a few runs), against Model
    Analyzer's search over the same noisy machine (every batch x instances in closed loops, the best
    measured kept). Both picks are judged by their true edges, as the judge would: the kit's is
    within a rung of Model Analyzer's on most seeds, and the kit never stays at the start when a
    better config exists."""
    law, slo = WORLDS[world]
    objective, start = Objective(slo, margin=RULES.slo_margin), Knobs(16, 0, 1)
    best = max(true_edge(k, law, slo) for k in grid(powers_of_two(16), delays=(0,)))
    assert best > true_edge(start, law, slo) * RULES.rate_step  # there is something to find
    as_good, stayed = 0, []
    for seed in range(20):
        sim = TrueWorldTrials(seed, objective.target_p95_ms, world=law)
        t = Search(sim, objective, bound=16, max_trials=TRIALS, log=lambda s: None).run(start)
        assert len(sim.trials) <= TRIALS
        pick = _batching(t.best.knobs) if t.written else start
        ma = quick_search(TrueWorldTrials(seed + 1000, objective.target_p95_ms, world=law), 16, 2, slo)
        as_good += true_edge(pick, law, slo) * RULES.rate_step >= (true_edge(ma, law, slo) if ma else 0.0)
        if pick == start:
            stayed.append(seed)
    assert as_good >= 15, as_good
    assert not stayed, stayed


def test_a_winner_the_confirmation_cannot_hold_is_kept_when_it_beat_the_start_beside_it():
    """Every confirmation run misses (a box that slowed past any rung the trials left can reach),
    yet each runs beside the start, which misses worse: the winner is still written, unconfirmed,
    and says so; the start is never what the search returns when a better config was measured."""
    sim = NeverConfirms()
    tuning = Search(sim, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None).run(Knobs(16, 8000, 1))
    assert not tuning.confirmed and not tuning.kept and tuning.written
    assert tuning.best.rate is None and tuning.claim_note.startswith("no claim")  # it missed every rate
    assert tuning.beside_start and all(w < s for w, s in tuning.beside_start)
    phases = [t.phase for t in sim.trials]
    assert phases[phases.index("confirm") + 1] == "beside"  # at the claimed rate, in the same minutes
    # and where the start is faster beside it, the start is what stays
    sim = NeverConfirms(start_faster=True)
    tuning = Search(sim, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None).run(Knobs(16, 8000, 1))
    n = len(tuning.beside_start)
    assert tuning.kept and not tuning.written
    assert f"the faster in 0 of {n} pairs and the start in {n}" in tuning.beside_why
    assert not tuning.claim_note  # the start is written: no word on a claim the winner never gets
    assert "did not win its side-by-side runs" in tuning.differs_because  # why the best measured is not written


class SlowerAfterTheScreen(TrueWorldTrials):
    """TRUE_WORLD, except that the finalists' runs after the screen are three times as slow (a
    neighbour's load that starts as the screen ends)."""

    def run(self, k: Knobs, load: Load, phase: str, classes=None) -> Trial:
        t = super().run(k, load, phase)
        if phase == "finalist" and t.p95_ms is not None:
            t.p95_ms = round(t.p95_ms * 3, 3)
            t.passed = t.p95_ms <= self.target_p95_ms
        return with_latencies(t)


def test_the_finalist_that_beat_the_start_side_by_side_is_kept_on_a_slower_minute():
    """The screen ranks a finalist above the start in the same minutes; then the box slows, and the
    finalist misses the rate it held in the screen (no run decides alone here: a majority does).
    It walks down to where it holds now and stays the incumbent: a later absolute figure does not
    undo a side-by-side comparison, and the confirmation runs the start beside it again."""
    sim = SlowerAfterTheScreen()
    start = Knobs(16, 0, 1)
    rules = replace(RULES, clear=math.inf)
    tuning = Search(sim, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None, rules=rules).run(start)
    finalist = [t for t in sim.trials if t.phase == "finalist"]
    assert finalist and not finalist[0].passed  # it missed its screen rate once the box slowed
    assert len({t.rate for t in finalist}) > 1  # and walked down
    assert not tuning.kept and tuning.written and tuning.beside_start
    assert true_edge(_batching(tuning.best.knobs)) > true_edge(start) * RULES.rate_step


class LuckyInTheScreen(TrueWorldTrials):
    """TRUE_WORLD, except that `k` screens as if it were `like` at `luck` of its P95 (one lucky run
    on a noisy box), and runs as itself everywhere else."""

    def __init__(self, k: Knobs, like: Knobs, luck: float = 0.8):
        super().__init__()
        self.k, self.like, self.luck = k, like, luck

    def run(self, k: Knobs, load: Load, phase: str, classes=None) -> Trial:
        lucky = phase == "screen" and k == self.k
        t = super().run(self.like if lucky else k, load, phase)
        if lucky and t.p95_ms is not None:
            t.p95_ms = round(t.p95_ms * self.luck, 3)
            t.passed = t.p95_ms <= self.target_p95_ms
        return with_latencies(t)


def test_a_finalist_lucky_in_the_screen_does_not_replace_a_start_that_held_more():
    """A finalist passes the screen's rung by luck, then walks down below the rate the start held on
    its own; beside the start at the confirmation it is no faster (pairs within the noise). No
    paired run showed it beat the start, so the start stands and nothing is written."""
    start, lucky = Knobs(8, 0, 2), Knobs(16, 0, 2)
    assert true_edge(lucky) < true_edge(start)
    sim = LuckyInTheScreen(lucky, start)
    rules = replace(RULES, clear=math.inf)  # no pair is clear: the tie's rule decides
    tuning = Search(sim, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None, rules=rules).run(start)
    assert any(t.phase == "finalist" and t.label == lucky.label() for t in sim.trials)  # it won the screen
    assert tuning.beside_start and all(s <= w for w, s in tuning.beside_start)
    assert tuning.kept and not tuning.written and "the start held" in tuning.beside_why


class StalledWalks(LuckyInTheScreen):
    """LuckyInTheScreen, except that the search after the screen runs in a stall (ten times the P95):
    no walk holds anywhere, and no neighbour either, as when the box stalled through detector's
    walks beside the noise source until the search's trials were spent. The confirmation runs
    as the world is."""

    def run(self, k: Knobs, load: Load, phase: str, classes=None) -> Trial:
        t = super().run(k, load, phase)
        if phase in ("finalist", "neighbour", "runner-up") and t.p95_ms is not None:
            t.p95_ms = round(t.p95_ms * 10, 3)
            t.passed = t.p95_ms <= self.target_p95_ms
        return with_latencies(t)


def test_a_finalist_whose_walk_held_nowhere_is_settled_beside_the_start():
    """The screen ranks a finalist above the start in the same minutes; then every walk stalls and
    none holds. The finalist is not thrown away for the start: the confirmation steps it down
    beside the start and writes it where it holds. A finalist that was only lucky in the screen
    holds no better there, and the start stands."""
    start = Knobs(16, 0, 1)
    sim = StalledWalks(None, None)
    rules = replace(RULES, clear=math.inf)  # no run decides alone: a walk needs its own runs
    tuning = Search(sim, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None, rules=rules).run(start)
    walked = [t for t in sim.trials if t.phase == "finalist"]
    assert walked and not any(t.passed for t in walked)
    assert not any(t.phase == "neighbour" for t in sim.trials)  # no climb from a config without a rate
    assert tuning.confirmed and tuning.written and tuning.beside_start
    assert true_edge(_batching(tuning.best.knobs)) > true_edge(start) * RULES.rate_step

    start, lucky = Knobs(8, 0, 2), Knobs(16, 0, 2)
    sim = StalledWalks(lucky, start, luck=0.5)
    tuning = Search(sim, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None, rules=rules).run(start)
    assert any(t.phase == "finalist" and t.label == lucky.label() for t in sim.trials)  # it won the screen
    assert tuning.kept and not tuning.written


def test_a_runner_up_that_held_as_high_in_the_screen_is_measured_above_the_winner():
    """The screen's two finalists held the same rate and one run apart ranked them (the wide
    recogniser beside the noise source: batch 16 x2 at 24.6 ms, batch 4 x2 at 26.6). The first
    walks up, misses the next rung, and the climb proposes no screened config again: without more,
    the runner-up is never measured above. It challenges the winner at the rung above it, and
    where its edge lies higher, it is written."""
    better, lucky = Knobs(8, 0, 2), Knobs(4, 0, 2)
    assert true_edge(better) > true_edge(lucky) * RULES.rate_step
    sim = LuckyInTheScreen(lucky, better, luck=0.95)  # a tie, within the noise
    tuning = Search(sim, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None).run(Knobs(16, 0, 1))
    assert any(t.phase == "finalist" and t.label == lucky.label() for t in sim.trials)  # it won the screen
    assert any(t.phase == "runner-up" and t.label == better.label() for t in sim.trials)
    assert _batching(tuning.best.knobs) == better and len(sim.trials) <= TRIALS


def test_a_tie_beside_the_start_keeps_the_start_only_where_it_held_as_much_and_led_the_pairs():
    """The confirmation's pairs as measured: convnet beside the noise source, where the winner had
    walked down to 2,559 req/s from a lucky screen run and the start held 3,891 (the start stands),
    and tiny on the quiet box, where the winner held 4,574 and the start 3,458 (the winner stands).
    Pairs that split evenly are no evidence against the winner: convnet again, where batch 8 x2 held
    4,281 req/s in the screen beside a start that missed it (554 ms), then held only 2,815 on its walk
    while the start had held 3,723 on its own; beside it, one pair each way (the winner stands, and
    the judge put it at 4,705 req/s against the start's 3,283-3,755 in two rounds of three)."""
    convnet = [(13.1, 8.9), (6.9, 5.9)]
    assert clear_wins(convnet, log_sd=1.1) == (0, 0)
    assert start_stands(convnet, 1.1, start_held=3891.0, winner_held=2559.0)
    assert not start_stands(convnet, 1.1, start_held=2000.0, winner_held=2559.0)
    split = [(8.9, 12.9), (25.6, 11.1)]
    assert clear_wins(split, log_sd=1.43) == (0, 0)
    assert not start_stands(split, 1.43, start_held=3723.0, winner_held=2815.0)
    tiny = [(12.2, 18.6), (10.3, 9.8), (9.8, 9.6)]
    assert not start_stands(tiny, 0.77, start_held=3458.0, winner_held=4574.0)
    assert not start_stands([(8.0, 12.0), (9.0, 13.0)], 0.77, start_held=5000.0, winner_held=4574.0)  # faster in all
    assert start_stands([(30.0, 10.0), (31.0, 10.5)], 0.2, start_held=0.0, winner_held=4574.0)  # clearly slower


def test_one_burst_beside_the_start_does_not_undo_the_winners_side_by_side_win():
    """Tiny beside the noise source: the winner's first confirmation run fell in a burst (139.0 ms
    against the start's 7.5) and the other two pairs were within the noise (log SD 0.94). The one
    clear pair is the start's, but one run in three is no majority: it is a tie, and the start,
    which held no rate on its own, does not stand. Clear in two of three pairs, it does."""
    burst = [(139.0, 7.5), (8.4, 8.1), (7.9, 8.6)]
    assert clear_wins(burst, 0.94) == (0, 1)
    assert not start_stands(burst, 0.94, start_held=0.0, winner_held=3357.0)
    assert start_stands(burst, 0.94, start_held=3357.0, winner_held=3357.0)  # a tie the start led and held as much
    twice = [(139.0, 7.5), (120.0, 7.9), (7.9, 8.6)]
    assert start_stands(twice, 0.94, start_held=0.0, winner_held=3357.0)
    assert not start_stands([(7.5, 139.0), (8.4, 8.1), (8.6, 7.9)], 0.94, start_held=5000.0, winner_held=3357.0)


class SlowDuringTheScreen(TrueWorldTrials):
    """TRUE_WORLD, except that every screening run is `factor` times as slow: a slow minute over the
    whole first round (or a first rung past every config's edge), so that no config holds there."""

    def __init__(self, factor: float = 5.0):
        super().__init__()
        self.factor = factor

    def run(self, k: Knobs, load: Load, phase: str, classes=None) -> Trial:
        t = super().run(k, load, phase)
        if phase == "screen" and t.p95_ms is not None:
            t.p95_ms = round(t.p95_ms * self.factor, 3)
            t.passed = t.p95_ms <= self.target_p95_ms
        return with_latencies(t)


def test_a_screen_round_that_no_config_held_still_ranks_them_side_by_side():
    """No config holds the screen's first rate, yet their P95s there, in the same minutes, put a
    better config above the start: that finalist walks from the round's rate to where it holds and
    becomes the incumbent, rather than the search keeping the start with its trials unspent."""
    sim = SlowDuringTheScreen()
    start = Knobs(16, 0, 1)
    tuning = Search(sim, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None).run(start)
    screen = [t for t in sim.trials if t.phase == "screen"]
    assert screen and not any(t.passed for t in screen)  # the round held nowhere
    finalist = [t for t in sim.trials if t.phase == "finalist"]
    # its walk starts from the round's rate: there, or a rung below where both its runs there (the
    # round's and its second) missed, which is a verdict already
    assert finalist and finalist[0].rate == pytest.approx(screen[0].rate / RULES.rate_step ** (
        sum(t.label == finalist[0].label for t in screen) > 1))
    assert not tuning.kept and tuning.written
    assert true_edge(_batching(tuning.best.knobs)) > true_edge(start) * RULES.rate_step


def test_of_configs_that_held_the_same_rate_the_written_one_is_the_best_measured():
    """The best measured config is compared with the one written: a tie at the same rate is no
    difference, whichever was measured first; a higher rate elsewhere is, and the report says why."""
    from tritonkit.tuner.objective import Score, Tuning

    search = Search(SimulatedTrials(), Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None)
    start, winner = Knobs(16, 0, 1), Knobs(8, 0, 2)
    search.held = {start: 3964.0, winner: 3964.0}
    tuning = Tuning(Objective(SLO_MS), Score(start, 3964.0, 3964.0, None), Score(winner, 3964.0, 3964.0, None),
                    None, 16)
    search._best_measured(tuning)
    assert tuning.best_measured == (winner.label(), 3964.0) and not tuning.differs_because
    search.held[start] = 4558.6
    tuning.best_measured, tuning.differs_because = None, ""
    search._best_measured(tuning)
    assert tuning.best_measured == (start.label(), 4558.6) and "within one rung" in tuning.differs_because


class NeverConfirms(SimulatedTrials):
    """WORLD, except that no confirmation run holds: the winner's P95 there is twice the SLO, and the
    start's beside it three times (or, `start_faster`, 0.8 of it: clearly faster, past the noise)."""

    def __init__(self, start_faster: bool = False):
        super().__init__()
        self.start_faster = start_faster

    def run(self, k: Knobs, load: Load, phase: str, classes=None) -> Trial:
        t = super().run(k, load, phase)
        if phase in ("confirm", "beside"):
            t.p95_ms = 2 * SLO_MS if phase == "confirm" else (0.8 if self.start_faster else 3) * SLO_MS
            t.passed = t.p95_ms <= SLO_MS
        return with_latencies(t)


def test_the_calibration_leaves_saturated_runs_out_and_says_when_it_cannot_predict():
    """A compute-heavy world, where closed loops of 8 and 32 clients queue far past the SLO: those
    runs are left out of the fit, the one batch size left cannot tell a fixed cost from a per-item
    one, and the search screens the whole space instead of trusting the fit's ranking."""
    law, slo = WORLDS["heavy"]
    sim = TrueWorldTrials(None, slo, world=law)
    lines: list[str] = []
    tuning = Search(sim, Objective(slo), bound=16, max_trials=TRIALS, log=lines.append).run(Knobs(16, 0, 1))
    assert not tuning.predicts
    assert any("left out of the fit" in line and "8, 32 clients" in line for line in lines), lines
    assert any("cannot predict" in line for line in lines)
    screened = {(t.knobs["max_batch_size"], t.knobs["instances"]) for t in sim.trials if t.phase == "screen"}
    assert screened == {(b, i) for b in powers_of_two(16) for i in (1, 2)}
    # the fit alone, from points that are not saturated, predicts a rate for a model whose one
    # execution is a large share of its SLO, where the headroom's rate predicts a P95 over it
    cm = CostModel(15.0, 22.0)
    assert predict_p95(cm, Knobs(1, 0, 1), cm.sustainable(1)) > slo
    assert 0 < cm.rate_within(1, 0, slo) < cm.sustainable(1)
    assert predict_p95(cm, Knobs(1, 0, 1), cm.rate_within(1, 0, slo)) <= slo * 1.001


def test_the_screen_narrows_the_field_by_comparisons_in_the_same_minutes():
    """Successive halving: every config once at the first rate, the better half of those that held
    on at a rate two rungs up in the opposite order, until no more than two hold; a finalist that
    missed the last round is handed on beside the one that held."""
    ks = [Knobs(b, 0, i) for b in (1, 2, 4, 8) for i in (1, 2)]
    edge = {k: 100 * k.max_batch * k.instances ** 0.5 for k in ks}  # a P95 that rises as a rate nears it
    h = Halving(ks, 100.0, rules=RULES)
    asked = []
    while (c := h.ask()) is not None:
        k, rate = c
        asked.append(c)
        p95 = 10 * rate / edge[k] if rate < edge[k] else math.inf
        h.tell(c, Seen(p95, p95 <= 9))
    rounds = [sorted({r for _, r in asked})]
    rates = sorted({r for _, r in asked})
    assert rates[1] == pytest.approx(100 * RULES.screen_raise) and len(rounds[0]) >= 2
    first = [k for k, r in asked if r == rates[0]]
    second = [k for k, r in asked if r == rates[1]]
    assert first == ks and len(second) <= math.ceil(len(ks) * RULES.screen_keep)
    assert second == sorted(second, key=lambda k: edge[k])  # the better ran last in the first round: first here
    best = max(ks, key=edge.get)
    assert h.finalists[0].knobs == best and h.finalists[0].rate == max(rates)
    assert len(h.finalists) == RULES.screen_finalists
    # out of budget mid-round: the field as measured so far decides, never an empty hand
    h = Halving(ks, 100.0, rules=RULES)
    h.tell(h.ask(), Seen(5.0, True))
    h.stop()
    assert h.finalists and h.finalists[0].knobs == ks[0] and h.finalists[0].rate == 100.0


def test_a_round_past_every_edge_leaves_the_ranking_to_the_round_they_all_held():
    """The wide recogniser's screen beside a noisy neighbour, as measured: ten configs at 165 req/s,
    five held; at 219 req/s none did, batch 2 x1 missed the least (124 ms) and batch 1 x2 the most
    but one (376 ms). Past its edge a config's P95 says how fast its queue grew in four seconds;
    at 165 req/s, where all five held in the same minutes, batch 1 x2 was the fastest (11.7 ms
    against 54.1). The finalists are the fastest there."""
    first = {(1, 1): 37.0, (1, 2): 11.7, (2, 1): 54.1, (2, 2): 107.6, (4, 1): 142.2, (4, 2): 114.7,
             (8, 1): 84.9, (8, 2): 49.8, (16, 1): 210.9, (16, 2): 302.0}
    second = {(8, 1): 676.1, (2, 1): 124.2, (8, 2): 549.6, (1, 1): 249.8, (1, 2): 376.1}
    h = Halving([Knobs(b, 0, i) for b, i in first], 165.3, rules=RULES)
    while (c := h.ask()) is not None:
        k, rate = c
        p95 = (first if rate == 165.3 else second)[(k.max_batch, k.instances)]
        h.tell(c, Seen(p95, p95 <= 90))
    assert [f.knobs for f in h.finalists] == [Knobs(1, 0, 2), Knobs(1, 0, 1)]
    assert {f.rate for f in h.finalists} == {165.3}  # what each held, for its walk to start from


def test_a_raised_round_runs_its_misses_again_where_they_decide_who_goes_on():
    """The wide recogniser's screen beside the noise source, as measured: ten configs at 144 req/s,
    eight held; at 190 req/s only batch 1 x2 did, and batch 2 x2, a close third at 144 (17.4 ms),
    missed at 382.5 ms, the way a run does that meets a neighbour's burst. With one run a round it
    was dropped for batch 16 x2, ahead at 144 by 0.1 ms. The round keeps three, so its two best
    misses by the round before run again, in the opposite order; batch 2 x2 holds its second run
    (the burst has passed) and is handed on, batch 16 x2 misses again."""
    first = {(1, 1): 25.1, (1, 2): 14.1, (2, 1): 37.6, (2, 2): 17.4, (4, 1): 47.2, (4, 2): 25.2,
             (8, 1): 114.9, (8, 2): 84.6, (16, 1): 94.7, (16, 2): 14.2}
    second = {(4, 2): [316.1], (1, 1): [241.4], (2, 2): [382.5, 21.0], (16, 2): [208.5, 231.0], (1, 2): [17.5]}
    h = Halving([Knobs(b, 0, i) for b, i in first], 143.8, rules=RULES)
    again = []
    while (c := h.ask()) is not None:
        k, rate = c
        if rate == 143.8:
            p95 = first[(k.max_batch, k.instances)]
        else:
            runs = second[(k.max_batch, k.instances)]
            p95 = runs[len(h.seen.get(k, {}).get(rate, []))]
            again += [k] if rate in h.seen.get(k, {}) else []
        h.tell(c, Seen(p95, p95 <= 90))
    assert again == [Knobs(16, 0, 2), Knobs(2, 0, 2)]  # the places left, in the opposite order
    assert [f.knobs for f in h.finalists] == [Knobs(1, 0, 2), Knobs(2, 0, 2)]
    assert {f.rate for f in h.finalists} == {143.8 * RULES.screen_raise}


def test_a_first_round_runs_again_the_misses_the_cost_model_ranks_fastest():
    """The convnet classifier's screen beside the noise source, as measured: ten configs at 2,969
    req/s, three held; batch 8 x2 and 16 x2, the two the cost model (T(B) = 0.342 + 0.156 B ms) ranks
    fastest, missed at 160 and 194 ms while batch 8 x1 held at 8.7 ms: a neighbour's burst. With one
    run in the first round they were dropped, and the judge put batch 8 x2 at 4,705 req/s against
    the 3,442 of the start that was written. The round keeps five, so the two places left go to the
    misses the model ranks fastest, which run again in the opposite order and hold; with no model
    that predicts, to the least slow misses."""
    first = {(1, 1): 632.2, (1, 2): 111.1, (2, 1): 491.5, (2, 2): 20.2, (4, 1): 28.8, (4, 2): 9.6,
             (8, 1): 8.7, (8, 2): 159.8, (16, 1): 8.6, (16, 2): 194.2}
    again = {(8, 2): 8.1, (16, 2): 7.9, (2, 2): 21.5, (4, 1): 30.2}
    ks = [Knobs(b, 0, i) for b, i in first]
    predicted = {k: k.instances * k.max_batch / (0.342 + 0.156 * k.max_batch) for k in ks}
    for prior, rerun in ((predicted, [Knobs(16, 0, 2), Knobs(8, 0, 2)]), ({}, [Knobs(4, 0, 1), Knobs(2, 0, 2)])):
        h = Halving(ks, 2969.0, rules=RULES, prior=prior)
        ran_again = []
        while (c := h.ask()) is not None and c[1] == 2969.0:
            k = c[0]
            repeat = 2969.0 in h.seen.get(k, {})
            ran_again += [k] if repeat else []
            p95 = (again if repeat else first)[(k.max_batch, k.instances)]
            h.tell(c, Seen(p95, p95 <= 18))
        assert ran_again == rerun  # the places left, in the opposite order
        assert c is not None and c[1] == pytest.approx(2969.0 * RULES.screen_raise)
        went_on = set(h._field)
        assert went_on == {Knobs(4, 0, 2), Knobs(8, 0, 1), Knobs(16, 0, 1)} | ({*rerun} if prior else set())


class SlowsDown(SimulatedTrials):
    """WORLD, with every execution half as slow again once the search is done (a neighbour's load)."""

    def run(self, k: Knobs, load: Load, phase: str, classes=None) -> Trial:
        t = super().run(k, load, phase)
        if phase == "speed":
            (b,) = t.batch_stats[1]["batch_stats"]
            b["compute_infer"]["ns"] *= 1.5
        return t


def test_the_tune_reports_how_the_machine_speed_moved():
    """The last calibration point is run again at the end: its batch's compute time, then and now."""
    for sim, change in ((SimulatedTrials(), 0.0), (SlowsDown(), 0.5)):
        search = Search(sim, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None)
        tuning = search.run(Knobs(16, 8000, 1))
        search.speed_check(tuning)
        assert sim.trials[-1].phase == "speed" and len(sim.trials) <= TRIALS
        assert tuning.speed["batch"] == 16 and tuning.speed["start_ms"] == pytest.approx(WORLD.t_ms(16))
        assert tuning.speed["change"] == pytest.approx(change)
    # no trial left: no check, and nothing claimed
    sim = SimulatedTrials()
    search = Search(sim, Objective(SLO_MS), bound=16, max_trials=6, log=lambda s: None)
    tuning = search.run(Knobs(16, 8000, 1))
    search.speed_check(tuning)
    assert tuning.speed is None and len(sim.trials) <= 6

def _run(n: int, ms: list[float], errors: int = 0, offered: bool = True) -> Trial:
    t = Trial(n, "confirm", "k", {}, "open", 1000.0, requests=len(ms) + errors, offered=offered,
              p95_ms=sorted(ms)[int(0.95 * len(ms)) - 1], error_ratio=errors / (len(ms) + errors))
    t.latencies_ms, t.ok_rps = tuple(ms), 1000.0 * len(ms) / (len(ms) + errors)
    return t


def test_a_rate_holds_by_the_requests_of_its_runs_pooled():
    """Two quick runs and one slow episode pass two of three runs, but not a load test of their
    length: pooled, 30% slow requests in one run are 10% of all, past the 5% a P95 allows."""
    quick, slow = [10.0] * 97 + [40.0] * 3, [10.0] * 70 + [40.0] * 30
    assert pooled_verdict([_run(1, quick), _run(2, quick)], 25.0, 0.01) is None  # a pass needs all three
    assert pooled_verdict([_run(1, quick), _run(2, quick), _run(3, quick)], 25.0, 0.01) is True
    assert pooled_verdict([_run(1, quick), _run(2, slow), _run(3, quick)], 25.0, 0.01) is False
    assert pooled_verdict([_run(1, slow)], 25.0, 0.01) is False  # 30 slow already exceed 5% of three runs: stop
    # 7% slow in each run fails each run, yet 4% + 4% + 7% pooled is a P95 within the SLO
    mixed = [10.0] * 96 + [40.0] * 4
    assert pooled_verdict([_run(1, mixed), _run(2, mixed), _run(3, [10.0] * 93 + [40.0] * 7)], 25.0, 0.01) is True
    assert pooled_verdict([_run(1, quick, errors=4)], 25.0, 0.01) is False  # errors over 1% of three runs
    assert pooled_verdict([_run(1, quick, offered=False)], 25.0, 0.01) is False
    p = pooled([_run(1, quick), _run(2, slow), _run(3, quick)])
    assert p.requests == 300 and p.p95_ms == 40.0 and p.p50_ms == 10.0 and p.note.startswith("3 runs pooled")

def test_the_grid_starts_lower_on_a_box_where_no_config_holds_its_first_rung():
    """A box slower than the grid's ladder assumes (a slow hour of this box held about 100 req/s):
    every config fails 200 req/s, so the grid screens all again from half the rate, and ends with
    figures rather than none."""
    from tritonkit.benchmarks import tuner_bench as bench

    class SlowBox:
        def __init__(self):
            self.trials: list[Trial] = []

        def open_load(self, rate: float) -> Load:
            return Load(rate=rate, duration_s=3, warmup_s=0.5, drain_s=1)

        def run(self, k: Knobs, load: Load, phase: str, classes=None) -> Trial:
            t = Trial(len(self.trials) + 1, phase, k.label(), k.to_json(), load.describe(), load.rate)
            t.passed, t.ok_rps = load.rate <= 30 * k.instances, load.rate
            self.trials.append(t)
            return t

    box = SlowBox()
    screened = bench.screen(box, [Knobs(16, 0, 1), Knobs(16, 0, 2)])
    # 50 req/s is the first start that any config holds: one instance (30 req/s) fails it too
    assert [(s.knobs.instances, round(s.rate, 1)) for s in screened] == [(2, 57.5)]
    assert [t.rate for t in box.trials if t.label == Knobs(16, 0, 1).label()] == [200, 100, 50]
    # where nothing holds even the lowest start, no figure rather than an endless ladder
    never = SlowBox()
    never.run = lambda k, load, phase, classes=None: Trial(1, phase, k.label(), k.to_json(), "", load.rate)
    assert bench.screen(never, [Knobs(16, 0, 1)]) == []


class _NoServer:
    def __init__(self, *a, **kw):
        pass

    def start(self):
        pass

    def close(self):
        pass


def world_judge(seen: list):
    """The judge's ladder on WORLD (no server): each entrant holds a rate while WORLD predicts its
    P95 within the SLO there; `seen` gets the entrants it was handed."""
    from tritonkit.benchmarks.judge import Run, ladder

    def fake(spec, model, entrants, work, *, p95_ms, rounds, log, **kw) -> dict:
        seen.extend(entrants)
        knobs = {e.name: Knobs(e.model.max_batch_size, e.model.batching.max_queue_delay_us, e.model.instances.count)
                 for e in entrants}
        start = max(best_sustained(k) for k in knobs.values()) * RULES.rate_step

        def measure(name: str, rate: float) -> Run:
            p95 = predict_p95(WORLD, knobs[name], rate)
            return Run(name, rate, "world", int(rate), rate, p95, 0.0, p95 <= p95_ms)

        figures, p95s = ladder({n: start for n in knobs}, {n: start / 8 for n in knobs}, rounds, measure, log)
        return {"entrants": {n: {"rounds_rps": figures[n], "p95_ms_at_figure": p95s[n], "held_above_start": 0,
                                 "runs": rounds} for n in knobs}}
    return fake


def on_world(module, monkeypatch) -> list[SimulatedTrials]:
    """A bench module (`tuner/bench.py`, `tuner/floor_bench.py`) run on WORLD: no server, no
    repository, the SLO objective; returns the simulated trials each `Trials(...)` it made."""
    import contextlib

    sims: list[SimulatedTrials] = []
    monkeypatch.setattr(module, "Trials", lambda *a, **kw: sims.append(SimulatedTrials()) or sims[-1])
    monkeypatch.setattr(module, "LocalServer", _NoServer)
    monkeypatch.setattr(module, "generate", lambda *a, **kw: None)
    monkeypatch.setattr(module, "repository_lock", lambda repo: contextlib.nullcontext())
    monkeypatch.setattr(module, "objective_for", lambda *a, **kw: Objective(SLO_MS))
    return sims


def test_bench_tuner_gives_the_tuner_its_share_of_the_grid_trials(tmp_path, monkeypatch):
    """The whole bench on WORLD: the grid runs first, the tuner gets 15% of the grid's trials as its
    budget, both winners are measured again, and the figures and the JSON say so."""
    import json

    from tritonkit.benchmarks import tuner_bench as bench

    sims = on_world(bench, monkeypatch)
    monkeypatch.setattr(bench, "max_batch_bound", lambda *a, **kw: 16)
    monkeypatch.setattr(bench, "from_spec", lambda m: Knobs(16, 8000, 1))
    # Trials carry no queue policy, but a spec with priority levels turns the batcher's prefetch off
    # all the same (as deploy.yaml's two levels do): one instance stalls on this server.
    levels = Batching(priority_levels=2, default_priority=2, default_queue_policy=QueuePolicy(max_queue_size=128))
    from tritonkit.tuner import simulated

    monkeypatch.setattr(simulated, "MODEL_SPEC", MODEL_SPEC.model_copy(update={"batching": levels}))
    traits = ServerTraits("2.51.0", stalls=True, safe_instances=2)
    judged = []
    out = bench.run_tuner_bench(SimulatedTrials.spec, "m", tmp_path, tmp_path, tmp_path, rounds=2,
                                traits=traits, final_judge=world_judge(judged), log=lambda s: None)
    grid_sim, tuner_sim = sims
    f = out["figures"]
    # the grid screens every config, one instance too, but neither side's winner is one the probe
    # found stalling, and the judge measures none
    assert any(t.knobs["instances"] == 1 for t in grid_sim.trials if t.phase == "grid")
    assert f["grid"]["stalling_configs"] == 20 and f["grid"]["stalling_trials"] > 0
    assert "x1" not in f["grid"]["best"] and "x1" not in f["tuner"]["best"], f
    assert {e.name for e in judged} == {"tuner", "grid"} and all(e.model.instances.count >= 2 for e in judged)
    assert f["trials_pct_of_safe_grid"] > f["trials_pct_of_grid"]
    assert len(tuner_sim.trials) <= f["tuner_budget"]  # the tuner kept to the budget the grid left it
    assert f["trials_pct_of_grid"] <= 15
    assert len(f["tuner"]["judged_rps"]) == len(f["grid"]["judged_rps"]) == 2
    # without noise the two differ by the resolution of a rate search at most: one rung
    assert f["throughput_pct_of_grid"] >= 100 / RULES.rate_step, f
    assert json.loads((tmp_path / "bench_tuner.json").read_text())["figures"] == json.loads(json.dumps(f))


def test_bench_floor_measures_the_spec_config_again_and_again(tmp_path):
    """`bench floor`: `rounds` judge rounds of the spec's config only; a box without noise gives the
    same figure every round, so the spread is 0."""
    import json

    from tritonkit.benchmarks import floor

    judged = []
    f = floor.run_floor_bench(SimulatedTrials.spec, "m", tmp_path, rounds=4, p95_ms=SLO_MS,
                              final_judge=world_judge(judged), log=lambda s: None)
    assert [e.name for e in judged] == ["config"]
    assert len(f["rounds_rps"]) == 4 and len(set(f["rounds_rps"])) == 1 and f["rounds_rps"][0] > 0
    assert f["spread"] == 0 and f["medians_of_3"] == f["rounds_rps"][:1]
    assert json.loads((tmp_path / "bench_floor.json").read_text())["figures"] == json.loads(json.dumps(f))


def test_the_floor_counts_rounds_that_held_nowhere_and_gives_each_bench_figure():
    from tritonkit.benchmarks.floor import floor_figures

    f = floor_figures([700.0, 800.0, 760.0, 820.0, 0.0, 790.0, 810.0])
    assert f["medians_of_3"] == [760.0, 790.0]  # the seventh round makes no three
    assert f["median_rps"] == 790.0 and f["spread"] == round(820 / 790, 3)
    assert f["medians_of_3_spread"] == round(30 / 775, 3)
    assert floor_figures([])["spread"] is None and floor_figures([])["medians_of_3"] == []


class SlowUntilTheEnd(SimulatedTrials):
    """WORLD, except that every open-loop run before the confirmation takes twenty times its P95 (a
    box busy for the whole search): no config holds anything there."""

    def run(self, k: Knobs, load: Load, phase: str, classes=None) -> Trial:
        t = super().run(k, load, phase)
        if load.rate is not None and phase != "confirm" and t.p95_ms is not None:
            t.p95_ms *= 20
            t.passed = t.p95_ms <= SLO_MS
        return with_latencies(t)


def test_a_search_where_nothing_held_still_ends_in_a_confirmed_figure():
    """A slow box fails every run of the search's budget, the screen's included: the trials kept for
    the end step the config the screen ranked first down beside the start until three pooled runs
    meet the SLO, instead of going unused; without a screen, the spec's own config."""
    spec_knobs = Knobs(16, 8000, 1)
    for screen in (True, False):
        sim = SlowUntilTheEnd()
        rules = RULES if screen else replace(RULES, screen_space=0)
        tuning = Search(sim, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None,
                        rules=rules).run(spec_knobs)
        k, rate = tuning.best.knobs, tuning.best.rate
        assert not tuning.baseline.passed and any(t.phase == "screen" for t in sim.trials) == screen
        assert tuning.confirmed and tuning.best.value > 0 and predict_p95(WORLD, k, rate) <= SLO_MS
        # the screen's first, where it is written, is no slower than the spec's own config there
        assert k != spec_knobs if screen else k == spec_knobs
        assert predict_p95(WORLD, k, rate) <= predict_p95(WORLD, spec_knobs, rate)
        assert len(sim.trials) <= TRIALS


class SlowerWhenConfirming(SimulatedTrials):
    """WORLD, except that the confirmation's runs meet the SLO only at 70% of its first rate or
    less (the box slowed down after the search): a clear fail above, an easy pass below. Its
    batcher collapses under overload, so the winner has no protective policy to confirm first."""

    def __init__(self, holds_below: float = 0.7):
        super().__init__(collapses=True)
        self.first: float | None = None
        self.holds_below = holds_below

    def run(self, k: Knobs, load: Load, phase: str, classes=None) -> Trial:
        t = super().run(k, load, phase)
        if phase == "confirm":
            self.first = self.first or load.rate
            t.p95_ms = 0.5 * SLO_MS if load.rate <= self.holds_below * self.first else 2 * SLO_MS
            t.passed = t.p95_ms <= SLO_MS
        return with_latencies(t)


def test_the_confirmation_steps_down_while_its_trials_last():
    """A box that slowed after the search fails the winner's rate and the next two rungs down: the
    confirmation goes on stepping down with the trials the budget kept for it, instead of stopping
    after three rates with trials unused, and confirms what the box now sustains."""
    sim = SlowerWhenConfirming()
    tuning = Search(sim, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lambda s: None).run(Knobs(16, 8000, 1))
    rates = sorted({round(t.rate) for t in sim.trials if t.phase == "confirm"}, reverse=True)
    assert len(rates) == 4, rates  # the fourth rung down: more than three rates
    assert tuning.confirmed and tuning.best.rate <= 0.7 * sim.first
    assert tuning.best.rate >= 0.7 * sim.first / RULES.rate_step  # the first rung that holds, not lower
    assert len(sim.trials) <= TRIALS


def test_a_confirmation_out_of_trials_claims_the_rate_its_runs_so_far_held():
    """The box slowed far after the search: the winner misses rung after rung, and the trials kept
    for the end run out while the first rung that holds has fewer runs than a confirmation pools.
    The claim is that rung, from its runs so far pooled, never a rate the confirmation missed; with
    no run at a rung that holds, there is no claim, and the report says which."""
    rules = replace(RULES, max_steps_down=10)  # steps enough that the trials, not the steps, run out
    for holds_below, partial in ((0.4, True), (0.25, False)):
        sim, lines = SlowerWhenConfirming(holds_below), []
        tuning = Search(sim, Objective(SLO_MS), bound=16, max_trials=TRIALS, log=lines.append,
                        rules=rules).run(Knobs(16, 8000, 1))
        confirming = [t for t in sim.trials if t.phase == "confirm"]
        missed = sorted({round(t.rate) for t in confirming if not t.passed}, reverse=True)
        assert not tuning.confirmed and len(sim.trials) == TRIALS
        if partial:
            held = [t for t in confirming if t.passed]
            assert 0 < len(held) < RULES.runs and {t.rate for t in held} == {tuning.best.rate}
            assert tuning.best.rate <= holds_below * sim.first and tuning.best.passed
            assert tuning.best.trial.p95_ms == 0.5 * SLO_MS and [t.n for t in tuning.best.runs] == [t.n for t in held]
            assert tuning.claim_note.startswith(f"claimed at {tuning.best.rate:.0f} req/s")
        else:
            assert all(not t.passed for t in confirming) and tuning.claim_note.startswith("no claim")
            assert tuning.best.rate is None  # nothing downstream (the gateway limit, a judge) reads a claim
        assert ", ".join(str(r) for r in missed) in tuning.claim_note
        assert any(tuning.claim_note in line for line in lines)


def test_trials_that_run_out_at_the_first_rate_keep_its_runs_so_far():
    """Out of trials two runs into the first rate (W S W), both within the SLO: no verdict and no rate
    missed, but the runs so far, pooled, are what a claim there rests on."""
    sim, start, k = SlowerWhenConfirming(holds_below=1.0), Knobs(16, 0, 1), Knobs(8, 0, 2)
    c = confirm(sim, [k], 500.0, step_down=True, objective=Objective(SLO_MS), limit=3, beside=start)
    assert c.score is None and not c.failed_at and len(c.pairs) == 1  # the start beside the first run
    assert c.partial is not None and c.partial.rate == 500.0 and [t.phase for t in c.partial.runs] == ["confirm"] * 2
    assert c.partial.trial.p95_ms == 0.5 * SLO_MS and len(sim.trials) == 3


class LuckyOnce(TrueWorldTrials):
    """TRUE_WORLD, except that `k` runs at `factor` times the P95 that `like` has there, and its first
    run is lucky: half of that (what one short run on a noisy box can show)."""

    def __init__(self, k: Knobs, like: Knobs, factor: float):
        super().__init__()
        self.k, self.like, self.factor, self.seen = k, like, factor, 0

    def run(self, k: Knobs, load: Load, phase: str, classes=None) -> Trial:
        t = super().run(self.like if k == self.k else k, load, phase)
        if k == self.k and t.p95_ms is not None and load.rate is not None:
            self.seen += 1
            t.p95_ms = round(t.p95_ms * (0.5 if self.seen == 1 else self.factor), 3)
            t.passed = t.p95_ms <= SLO_MS
        return with_latencies(t)


@pytest.mark.parametrize("factor, kept", [(1.1, False), (0.5, True)])
def test_a_candidate_lucky_in_one_run_is_not_kept_but_a_better_one_is(factor, kept):
    """For the lowest P95 at a rate, one run at half the incumbent's P95 is only a screening pass:
    interleaved runs decide. A candidate 10% slower than the incumbent is not kept after its lucky
    run; one twice as fast is."""
    incumbent_knobs, candidate = Knobs(16, 2000, 2), Knobs(16, 500, 2)
    sim = LuckyOnce(candidate, incumbent_knobs, factor)
    search = Search(sim, Objective(SLO_MS, rps=800.0), bound=16, max_trials=60, log=lambda s: None)
    incumbent = search.evaluate(incumbent_knobs, "start")
    before = len(sim.trials)
    won = search.challenge(incumbent, candidate)
    assert (won is not None) == kept
    phases = [t.phase for t in sim.trials[before:before + 4]]
    assert phases == ["neighbour", "incumbent", "incumbent", "neighbour"]  # C I I C, past the screen
    if kept:
        assert won.rate >= incumbent.rate


def test_the_noise_rules():
    # the spread estimate follows the machine: lognormal runs of a known spread, several groups
    rng = np.random.default_rng(1)
    noise = Noise()
    for group in range(12):
        for _ in range(3):
            noise.observe(group, 20.0 * math.exp(0.3 * rng.normal()))
    assert 0.2 < noise.log_sd < 0.4 and noise.repeats == 24
    assert Noise().log_sd == pytest.approx(0.2)  # the prior alone
    # one run decides a rate only when it is far from the target
    assert clear(10.0, True, 25.0, 0.2) and not clear(22.0, True, 25.0, 0.2)
    assert clear(None, False, 25.0, 0.2) and clear(40.0, False, 25.0, 0.2) and not clear(28.0, False, 25.0, 0.2)
    assert relative_range([566.0, 685.0, 650.0]) == pytest.approx(119 / 650)
    assert relative_range([0.0, 0.0, 0.0]) is None and relative_range([500.0]) is None  # a bench side that never held
    assert majority([True]) is None and majority([True, False]) is None
    assert majority([True, True]) and majority([False, True, False]) is False
    # a win needs every pair and a mean gain beyond the noise of the mean
    assert wins([(10.0, 20.0), (11.0, 21.0)], 0.2)
    assert not wins([(10.0, 20.0), (22.0, 21.0)], 0.2)  # lost one pair
    assert not wins([(18.0, 20.0), (18.0, 20.0)], 0.2)  # 10% is within this machine's noise
    assert wins([(18.0, 20.0), (18.0, 20.0)], 0.03)  # and beyond a quiet one's
    assert not wins([(math.inf, 20.0), (10.0, 20.0)], 0.2)  # a failed candidate run loses


def test_trial_length_follows_the_rate_within_its_bounds():
    window = TrialWindow()
    assert window.window_s(1000) == 3.0  # 3000 requests
    assert window.window_s(100) == window.max_s  # not 30 s: the time budget of one trial
    assert window.window_s(5000) == window.duration_s
    assert TrialWindow(max_s=3).window_s(300) == 3


def test_the_generators_own_stalls_are_taken_out_of_latencies():
    """A request seen done right after a stall may have waited for the loop: half the stall it was
    in flight for is its expected wait. One seen done long after the stall waited for the server."""
    samples = [Sample("default", 0.0, 0.0, 0.026),  # seen 1 ms after the 20 ms stall ended
               Sample("default", 0.0, 0.0, 0.060),  # still at the server 35 ms after it ended
               Sample("default", 0.1, 0.1, 0.010), Sample("default", 0.2, 0.2, None, "timeout")]
    stalls = [(0.005, 0.025)]
    assert without_stalls(samples, stalls) == pytest.approx([0.016, 0.060, 0.010])
    assert without_stalls(samples, []) == pytest.approx([0.026, 0.060, 0.010])


# -- the online sidecar --------------------------------------------------------------------------

class ModelControl:
    """The model-control calls the controller makes, kept in memory: a loaded config is ready."""

    def __init__(self, cfg: mc.ModelConfig):
        self.cfg, self.loads = cfg, 0

    def config(self, model: str) -> mc.ModelConfig:
        return self.cfg

    def live(self) -> bool:
        return True

    def load(self, model: str, cfg: mc.ModelConfig, files: dict | None = None) -> None:
        self.loads += 1
        self.cfg = cfg

    def model_ready(self, model: str) -> bool:
        return True


def _controller(**settings) -> tuple[Controller, ModelControl]:
    cfg = mc.ModelConfig(name="online", max_batch_size=16)
    cfg.instance_group.add(count=2)
    cfg.dynamic_batching.max_queue_delay_microseconds = 20000
    cfg.dynamic_batching.preferred_batch_size.append(16)
    control = ModelControl(cfg)
    ctl = Controller(control, "online", 15.0, OnlineSettings(**settings), None, lambda s: None)
    ctl.cost = CostModel(2.0, 0.3)
    return ctl, control


def _window(ctl: Controller, t: float, rate: float, mean_ms: float) -> Observation:
    dyn = ctl.config.dynamic_batching
    w = Observation(t, rate, int(rate), mean_ms, mean_ms / 2, 4.0, 0.0, dyn.max_queue_delay_microseconds,
               list(dyn.preferred_batch_size))
    ctl.state.observations.append(w)
    return w


def test_online_setpoints_follow_the_rate_within_the_slo_budget():
    ctl, _ = _controller()
    assert ctl.setpoint(100) == (0, [])  # light load: no waiting
    delay, pref = ctl.setpoint(1000)
    assert delay > 0 and pref and pref[0] >= 4  # heavier load: fill batches
    assert delay < 15_000  # a wait the 15 ms SLO leaves room for
    batches = [(ctl.setpoint(r)[1] or [1])[0] for r in (100, 1000, 3000, 6000)]
    assert batches == sorted(batches) and batches[-1] > batches[0]  # more traffic, larger batches


def test_online_needs_agreeing_observations_cools_down_and_rolls_back_a_worse_change():
    ctl, control = _controller(cooldown_s=10, settle_observations=2)
    heavy_delay, _ = ctl.setpoint(3000)
    ctl.step(_window(ctl, 1, 3000, 5.0), now_t=20.0)
    assert ctl.state.changes == 0 and control.loads == 0  # one window is not enough
    ctl.step(_window(ctl, 2, 3000, 5.0), now_t=21.0)
    assert ctl.state.changes == 1 and control.cfg.dynamic_batching.max_queue_delay_microseconds == heavy_delay
    ctl.step(_window(ctl, 3, 3000, 9.0), now_t=22.0)  # 80% slower at the same rate: worse
    assert ctl.state.rollbacks == 1 and control.cfg.dynamic_batching.max_queue_delay_microseconds == 20000
    for t in range(4, 30):  # frozen after a rollback: twice the cool-down
        ctl.step(_window(ctl, t, 3000, 5.0), now_t=20.0 + t)
        if 20.0 + t < 22.0 + 2 * 10:
            assert ctl.state.changes == 1, t
    assert ctl.state.changes == 2  # and then it tries again


def test_online_does_not_thrash_under_a_wobbling_overload():
    """A load around three times what it takes, wobbling by 10% window to window: one change to
    batching, then it stays (it may widen batching, never swing back and forth)."""
    ctl, control = _controller(cooldown_s=2, settle_observations=2)
    rng = np.random.default_rng(0)
    delays = []
    for t in range(60):
        rate = 6000 * (1 + 0.1 * rng.uniform(-1, 1))
        ctl.step(_window(ctl, t, rate, 12.0), now_t=float(t))
        delays.append(control.cfg.dynamic_batching.max_queue_delay_microseconds)
    changes = sum(a != b for a, b in zip(delays, delays[1:]))
    assert ctl.state.rollbacks == 0 and changes <= 2, delays


# -- the router ----------------------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeEndpoint:
    """An endpoint's client: answers after `latency_s` (or fails), counts what it got and what was
    cancelled on the way."""

    def __init__(self, latency_s: float = 0.001, fail: bool = False, version: str = "2.54.0"):
        self.latency_s, self.fail, self.version = latency_s, fail, version
        self.calls = self.finished = self.cancelled = 0

    async def live(self) -> bool:
        return True

    async def server_version(self) -> str:
        return self.version

    async def infer(self, model, arrays, **kw):
        self.calls += 1
        try:
            await asyncio.sleep(self.latency_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1
        if self.fail:
            raise UnavailableError("connection refused")
        return {"y": arrays["x"]}

    async def close(self) -> None:
        pass


def _router(urls, policy=None, clock=None, fakes=None) -> AsyncRouter:
    fakes = fakes or {u: FakeEndpoint() for u in urls}
    return AsyncRouter(urls, policy or RouterPolicy(explore=0.0), seed=1, clock=clock or Clock(),
                       connect=lambda url, protocol: fakes[url])


def _measured(router: AsyncRouter, service_ms: dict[str, float], rtt_ms: dict[str, float]) -> None:
    for ep in router.endpoints:
        for _ in range(20):
            ep.observe_rtt(rtt_ms[ep.url] / 1e3)
            ep.window.add(service_ms[ep.url] / 1e3)


@pytest.mark.parametrize("edge_ms, chosen", [(10.0, "edge:1"), (80.0, "cloud:1")])
def test_router_chooses_min_of_edge_and_cloud_plus_network(edge_ms, chosen):
    """min(L_edge, L_cloud + L_net): a healthy edge wins over a cloud 30 ms away; a slow one loses."""
    router = _router(["edge:1", "cloud:1"])
    _measured(router, {"edge:1": edge_ms, "cloud:1": 10.0}, {"edge:1": 0.2, "cloud:1": 30.0})
    assert {router._choose([]).url for _ in range(50)} == {chosen}


def test_router_probes_more_often_the_nearer_the_chosen_endpoint_comes_to_the_other():
    """The other endpoint is probed once per 0.1 s x L_other / L_chosen, within 10% of requests: a
    cloud 4x slower than a healthy edge every 0.4 s; an edge last seen at 85 ms while the cloud
    answers in 40 ms every ~0.2 s; an edge as fast as the cloud every 0.1 s."""
    def probes(edge_ms: float, per_s: int = 300, seconds: float = 2.0, explore: float = 0.1) -> int:
        clock = Clock()
        router = _router(["edge:1", "cloud:1"], RouterPolicy(explore=explore, explore_interval_s=0.1), clock)
        _measured(router, {"edge:1": edge_ms, "cloud:1": 10.0}, {"edge:1": 0.5, "cloud:1": 30.0})
        best = router._choose([]).url
        picks = []
        for _ in range(int(seconds * per_s)):
            clock.t += 1 / per_s
            router.routed += 1
            picks.append(router._choose([]).url)
        return sum(p != best for p in picks)

    assert probes(9.5) == 5  # 10 vs 40 ms
    assert 9 <= probes(85.0) <= 10  # 85.5 vs 40 ms
    assert probes(39.0) == 20  # 39.5 vs 40 ms
    assert probes(39.0, per_s=50) == 10  # ... but at most 10% of the requests
    assert probes(39.0, explore=0.0) == 0


def test_small_sample_estimate_is_a_median_so_one_set_up_sample_does_not_decide():
    """Over 3 samples a P95 is their maximum: one slow first request (a connection set up through
    the link) would make a 40 ms cloud look like 130 ms. Fewer than 20 recent samples: the median of
    the newest 3; from 20 on, the P95 of the last half second."""
    clock = Clock()
    w = LatencyWindow(horizon_s=0.5, clock=clock)
    for ms in (100.0, 10.0, 11.0):
        w.add(ms / 1e3)
    assert w.estimate() == pytest.approx(0.011)
    clock.t += 10.0  # no traffic for a long time: the last known estimate stands
    assert w.estimate() == pytest.approx(0.011)
    for i in range(40):  # a busy endpoint: 10% of its requests at 50 ms show in its P95
        w.add(0.050 if i % 10 == 0 else 0.010)
    assert w.estimate() > 0.030
    clock.t += 0.6  # half a second later those samples are out of the P95, and two new ones rule
    w.add(0.080), w.add(0.080)
    assert w.estimate() == pytest.approx(0.080)


def _simulate(edge_service_ms: Callable[[float], float], seconds: float, concurrency: int = 4) -> list[Sent]:
    """The router's decisions over a fake clock: `concurrency` requests in flight, each answered
    after its endpoint's service time plus round trip (edge 0.5 ms away, cloud 30 ms away with
    10 ms of service). Pings, estimates and probes run as in the router; only time is simulated."""
    rtt_ms = {"edge:1": 0.5, "cloud:1": 30.0}
    clock = Clock()
    start = clock.t
    router = _router(list(rtt_ms), RouterPolicy(), clock)
    for ep in router.endpoints:
        ep.observe_rtt(rtt_ms[ep.url] / 1e3)
    flight: list[tuple[float, int, object, float]] = []
    sent: list[Sent] = []

    def launch(t: float) -> None:
        clock.t = start + t
        router.routed += 1
        ep = router._choose([])
        service = edge_service_ms(t) if ep.url == "edge:1" else 10.0
        latency = (service + rtt_ms[ep.url]) / 1e3
        heapq.heappush(flight, (t + latency, len(sent), ep, latency))
        sent.append(Sent(t, ep.url, ep.url, latency * 1e3))

    for _ in range(concurrency):
        launch(0.0)
    while flight:
        t, _, ep, latency = heapq.heappop(flight)
        clock.t = start + t
        ep.succeeded(latency)
        if t < seconds:
            launch(t)
    return sent


def test_router_moves_off_a_slowed_edge_and_back_within_a_second_on_a_fake_clock():
    """The routing cases decided on a fake clock: an edge whose batcher starts waiting 80 ms (85 ms
    in all) at 3 s and is itself again at 6 s, against a cloud of 40 ms."""
    step = _simulate(lambda t: 85.0 if 3 <= t < 6 else 3.0, 9.0)
    off, back = switch_time(step, "cloud:1", 3.0, 6.0), switch_time(step, "edge:1", 6.0, 9.0)
    assert off is not None and back is not None and off <= 1.0 and back <= 1.0, (off, back)
    assert share([s for s in step if 4 <= s.at < 6], "edge:1") <= 0.2  # only probes while slow
    healthy, slow = _simulate(lambda t: 3.0, 3.0)[:300], _simulate(lambda t: 85.0, 10.0)[:300]
    assert share(healthy, "edge:1") >= 0.95 and share(slow, "edge:1") <= 0.2


def test_switch_time_is_when_a_second_of_quarter_seconds_went_mostly_to_the_better_endpoint():
    sends = [Sent(t / 100, "a" if t < 150 or t % 10 == 0 else "b", "a", 1.0) for t in range(100, 400)]
    # from 1.5 s on only every 10th request (10%) goes to a: b took over 0.5 s after the change at 1.0
    assert switch_time(sends, "b", 1.0, 4.0) == pytest.approx(0.5, abs=0.03)
    assert switch_time(sends, "a", 1.0, 4.0) is None  # a never got its 80% back
    assert switch_time(sends, "a", 1.0, 1.5) is None  # a had it, but not for a whole second
    assert switch_time([Sent(t / 100, "a", "a", 1.0) for t in range(200)], "a", 0.0, 2.0) == 0.0
    # a stall later on (0.2 s all to a) does not undo a switch that had settled
    stalled = [Sent(x.at, "a", "a", 1.0) if 3.0 <= x.at < 3.2 else x for x in sends]
    assert switch_time(stalled, "b", 1.0, 4.0) == switch_time(sends, "b", 1.0, 4.0)


def test_router_breaker_takes_a_failing_endpoint_out_and_no_request_is_lost():
    fakes = {"edge:1": FakeEndpoint(fail=True), "cloud:1": FakeEndpoint()}

    async def go():
        async with _router(list(fakes), RouterPolicy(explore=0.0, breaker_failures=3), fakes=fakes) as r:
            outs = [await r.infer_routed("m", {"x": np.ones(2)}) for _ in range(40)]
            return outs, r.counters()

    outs, counters = asyncio.run(go())
    assert counters["ok"] == 40 and not counters["errors"]
    assert all(o.endpoint == "cloud:1" for o in outs)
    assert fakes["edge:1"].calls == 3 and counters["endpoints"]["edge:1"]["breaker"] == "open"
    assert counters["retries"] == 3


def test_a_slow_endpoint_is_left_by_its_estimate_and_its_breaker_stays_closed():
    """Given up after 5x its expected latency and retried elsewhere, a slow edge is not a failing one:
    its estimate moves traffic off it (and probes see it recover), while an open breaker would
    keep it out for the whole cool-down."""
    fakes = {"edge:1": FakeEndpoint(0.3), "cloud:1": FakeEndpoint(0.001)}

    async def go():
        async with _router(list(fakes), RouterPolicy(explore=0.0, breaker_failures=2), fakes=fakes) as r:
            _measured(r, {"edge:1": 1.0, "cloud:1": 1.0}, {"edge:1": 0.2, "cloud:1": 5.0})
            outs = [await r.infer_routed("m", {"x": np.ones(2)}) for _ in range(10)]
            return outs, r.counters()

    outs, c = asyncio.run(go())
    edge = c["endpoints"]["edge:1"]
    assert c["ok"] == 10 and all(o.endpoint == "cloud:1" for o in outs)
    assert edge["errors"] == {"deadline": 2} and c["retries"] == 2  # two given up, then it was left
    assert edge["breaker"] == "closed" and edge["breaker_trips"] == 0 and edge["service_ms"] >= 45


def test_router_hedges_stay_within_their_budget():
    """Every request would like a hedge (after 0 s): the budget allows one in five."""
    fakes = {"edge:1": FakeEndpoint(0.002), "cloud:1": FakeEndpoint(0.002)}

    async def go():
        policy = RouterPolicy(explore=0.0, hedge_budget=0.2, hedge_after_s=0.0)
        async with _router(list(fakes), policy, fakes=fakes) as r:
            for _ in range(100):
                await r.infer("m", {"x": np.ones(2)})
            return r.counters()

    c = asyncio.run(go())
    assert c["ok"] == 100 and 19 <= c["hedges"] <= 20
    assert sum(f.calls for f in fakes.values()) == 100 + c["hedges"]


class HeldEndpoint(FakeEndpoint):
    """An endpoint that answers only once `release` is set (None as its version: it never says)."""

    def __init__(self, version: str | None):
        super().__init__(version=version or "")
        self.release, self.says = asyncio.Event(), version is not None

    async def server_version(self) -> str:
        if not self.says:
            raise UnavailableError("no answer")
        return self.version

    async def infer(self, model, arrays, **kw):
        self.calls += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1
        return {"y": arrays["x"]}


@pytest.mark.parametrize("version, cancelled", [("2.51.0", False), ("2.54.0", True), (None, False)])
def test_a_hedge_that_lost_is_cancelled_only_where_the_server_survives_it(version, cancelled):
    """Triton before 2.54 can crash on a cancelled request: there the attempt that lost the race is
    left to finish, unread and unjudged, and the router's close waits for it; from 2.54 on it is
    cancelled. A server whose version is unknown (no answer) is taken for one that does not survive
    it. Either way the loser counts once, as given up, never as an answer or a failure too."""
    edge = HeldEndpoint(version)
    fakes = {"edge:1": edge, "cloud:1": FakeEndpoint(0.001, version=version or "2.54.0")}

    async def go():
        policy = RouterPolicy(explore=0.0, hedge_budget=1.0, hedge_after_s=0.0, attempt_timeout_factor=0)
        r = _router(list(fakes), policy, fakes=fakes)
        async with r:
            _measured(r, {"edge:1": 1.0, "cloud:1": 5.0}, {"edge:1": 0.2, "cloud:1": 5.0})  # edge first
            out = await r.infer_routed("m", {"x": np.ones(2)})
            edge.release.set()  # the loser may answer now: after the router stopped waiting for it
        return out, r.counters()

    out, c = asyncio.run(go())
    assert out.endpoint == "cloud:1" and c["hedges"] == 1
    assert (edge.cancelled, edge.finished) == ((1, 0) if cancelled else (0, 1))
    judged = c["endpoints"]["edge:1"]
    assert (judged["cancelled"], judged["ok"], judged["failed"], judged["breaker"]) == (1, 0, 0, "closed")


def test_the_judge_ladder_scores_each_entrant_where_it_stops_holding():
    """The judge's rule, without a server: each entrant from its start down in 15% rungs to its
    first hold, then up in 5% steps while it holds, the entrants taking one run each in turn (the
    first alternating between rounds); a figure is the last rate that held, within one step of
    where the entrant stops holding; one that holds nowhere scores 0."""
    from tritonkit.benchmarks.judge import Run, ladder

    edges = {"a": 500.0, "b": 400.0, "never": 0.0}
    calls: list[tuple[str, float]] = []

    def measure(name: str, rate: float) -> Run:
        calls.append((name, rate))
        return Run(name, rate, "fake", 100, rate, 10.0, 0.0, rate <= edges[name])

    names = ("a", "b", "never")
    figures, p95s = ladder(dict.fromkeys(names, 600.0), dict.fromkeys(names, 150.0), 2, measure, log=lambda s: None)
    for name in ("a", "b"):
        assert len(figures[name]) == 2 and edges[name] / JUDGE_STEP < figures[name][0] <= edges[name], figures
    assert figures["a"][0] > figures["b"][0] and figures["never"] == [0.0, 0.0] and p95s["never"] == [None, None]
    assert calls[0] == ("a", 600.0) and calls[1] == ("b", 600.0)  # the same rate for all, interleaved
    second = calls[[i for i, c in enumerate(calls) if c[1] == 600.0][3]:]
    assert second[0][0] == "b"  # round 2 starts with the next entrant
    assert min(r for _, r in calls) >= 150.0  # never below the floor
    # down in 15% rungs, then up in 5% steps short of the rung it missed: never a rate twice
    walk = [r for n, r in calls[:len(calls) // 2] if n == "b"]  # its edge 400: three misses, a hold, a miss
    assert walk == pytest.approx([600.0, 600 / 1.15, 600 / 1.15 ** 2, 600 / 1.15 ** 3, 600 / 1.15 ** 3 * JUDGE_STEP])
    assert len(set(walk)) == len(walk)
    # an entrant that holds at its start climbs to its edge: a claim set too low is no ceiling
    calls.clear()
    figures, _ = ladder({"a": 300.0, "b": 600.0}, {"a": 75.0, "b": 150.0}, 1, measure, log=lambda s: None)
    assert edges["a"] / JUDGE_STEP < figures["a"][0] <= edges["a"]
    assert edges["b"] / JUDGE_STEP < figures["b"][0] <= edges["b"]
    assert max(r for n, r in calls if n == "a") <= edges["a"] * JUDGE_STEP  # one missed rung above its edge
    # one that still holds at the climb's limit scores that run, the last rate it held
    calls.clear()
    figures, _ = ladder({"a": 300.0}, {"a": 75.0}, 1, measure, log=lambda s: None, climb_limit=1.2)
    assert [r for _, r in calls] == pytest.approx([300.0, 315.0, 330.75, 347.2875])
    assert figures["a"] == pytest.approx([347.2875])


def test_a_winner_that_batches_as_the_start_did_is_kept_not_a_change():
    from tritonkit.tuner.objective import Score, Tuning

    start = Score(Knobs(16, 2000, 2), 500.0, 500.0, None)
    protected = Score(Knobs(16, 2000, 2, queue=QueuePolicy(max_queue_size=16)), 520.0, 520.0, None)
    assert Tuning(Objective(SLO_MS), start, protected, None, 16).kept  # a new queue policy alone moves nothing
    moved = Score(Knobs(8, 2000, 2), 600.0, 600.0, None)
    assert not Tuning(Objective(SLO_MS), start, moved, None, 16).kept


def test_every_entrant_starts_the_judges_ladder_at_the_same_rate():
    """Beside the noise source the same config, started from three entrants' own claims (177, 375
    and 285 req/s), was judged 195, 240 and 300: a walk down stops at its first hold, a climb at its
    first miss, so a ladder is anchored where it starts. Every entrant now starts a rung above the
    highest claim and stops at the floor below the lowest."""
    from tritonkit.benchmarks.judge import FLOOR_BELOW, START_ABOVE, ladder_bounds

    start, floor = ladder_bounds({"kit1": 177.0, "kit2": 375.0, "model_analyzer": 285.0})
    assert start == pytest.approx(375.0 * START_ABOVE) and floor == pytest.approx(177.0 / FLOOR_BELOW)
    assert ladder_bounds({"a": 100.0}, floor_rps=10.0) == (pytest.approx(100.0 * START_ABOVE), 10.0)


def test_the_judge_brackets_a_claim_from_a_capacity_either_side_of_it():
    """Without a claim, the judge starts from the entrant's closed-loop capacity: down in 15% steps
    to the first rate that holds, or up while it holds where the client limited that capacity."""
    from tritonkit.benchmarks.judge import START_ABOVE, Run, bracket

    def measure_until(edge: float):
        return lambda name, rate: Run(name, rate, "fake", 100, rate, 10.0, 0.0, rate <= edge)

    below = bracket("x", 1000.0, measure_until(700.0))
    assert 700.0 / START_ABOVE < below <= 700.0
    above = bracket("x", 1000.0, measure_until(1600.0))
    assert 1600.0 / START_ABOVE < above <= 1600.0


def test_one_check_against_the_slo():
    from tritonkit.slo import meets

    assert meets(24.9, 25.0) and meets(25.0, 25.0, 0.01, 0.01)
    assert not meets(25.1, 25.0) and not meets(10.0, 25.0, 0.02, 0.01)
    assert not meets(None, 25.0) and not meets(float("nan"), None)  # nothing succeeded: meets nothing
    assert meets(80.0, None)  # no limit: any P95 that exists


def test_for_throughput_a_neighbour_wins_by_holding_the_rung_the_incumbent_missed():
    """The most throughput: a neighbour is tried at the rung above the incumbent's sustained rate;
    one that sustains more holds there and wins (then climbs), one that sustains less misses and
    costs one run."""
    objective = Objective(SLO_MS)
    sim = TrueWorldTrials()
    search = Search(sim, objective, bound=16, max_trials=60, log=lambda s: None)
    weak, strong = Knobs(16, 2000, 1), Knobs(16, 2000, 2)
    assert true_edge(strong) > true_edge(weak) * RULES.rate_step ** 2
    incumbent = search.evaluate(weak, "start", start_rate=100.0)
    before = len(sim.trials)
    won = search.challenge(incumbent, strong)
    assert won is not None and won.rate > incumbent.rate
    assert sim.trials[before].rate == pytest.approx(incumbent.rate * RULES.rate_step)
    before = len(sim.trials)
    assert search.challenge(won, weak) is None and len(sim.trials) - before == 1


def test_a_neighbour_that_holds_the_rung_above_wins_only_beside_the_incumbent():
    """The wide recogniser beside the noise source: the runner-up held the rung above in two runs,
    minutes after the incumbent had missed it once, and only one trial was left. A hold minutes
    after a miss is no comparison: without the pair beside the incumbent it decides nothing, and
    the incumbent stays; with the trials for the pair, the same neighbour wins."""
    objective = Objective(SLO_MS)
    weak, strong = Knobs(16, 2000, 1), Knobs(16, 2000, 2)
    rules = replace(RULES, clear=math.inf)  # every verdict takes the majority: two holding runs
    for left, decided in ((1, False), (2, True)):
        sim = TrueWorldTrials()
        search = Search(sim, objective, bound=16, max_trials=60, log=lambda s: None, rules=rules)
        incumbent = search.evaluate(weak, "start", start_rate=100.0)
        search.max_trials = len(sim.trials) + search.reserved + 2 + left  # `left` after the verdict
        before = len(sim.trials)
        won = search.challenge(incumbent, strong)
        runs = sim.trials[before:]
        assert [t.passed for t in runs if t.label == strong.label()][:2] == [True, True]
        assert (won is not None) == decided, left
        assert any(t.phase == "incumbent" for t in runs) == decided  # the pair beside it, where it could run


def test_the_ablation_bench_switches_each_rule_off_in_one_place(tmp_path):
    """`bench ablation` runs the noisy world once per variant of the one Rules object: with every
    rule on, no confirmed rate lies past its config's true edge; without the one-run verdict every
    rung takes a majority of runs, so the search spends more runs per rung."""
    import json

    from tritonkit.benchmarks.ablation import VARIANTS, run_ablation

    r = run_ablation(tmp_path, real=[], seeds=4, log=lambda s: None)
    sim = r["simulated"]
    assert set(sim) == set(VARIANTS) and all(s["seeds"] == 4 for s in sim.values())
    assert sim["all rules"]["confirmed"] >= 3 and sim["all rules"]["over_true_edge"] == 0
    assert sim["no one-run verdict (always a majority of 3)"]["runs_per_rung"] > sim["all rules"]["runs_per_rung"]
    assert json.loads((tmp_path / "bench_ablation.json").read_text())["simulated"] == sim


# -- joint tuning of a traffic mix ----------------------------------------------------------------

class SimulatedMix:
    """Two models sharing two cores, answered by their cost models: each entry's P95 is its own
    estimate at its rate, stretched by the cores the other model's executions take."""

    def __init__(self):
        from tritonkit.slo import SloBound
        from tritonkit.tuner.mix import Entry

        self.costs = {"heavy": CostModel(4.0, 1.0), "light": CostModel(0.5, 0.05)}
        self.entries = [Entry("heavy", 60.0, SloBound(60.0, margin=0.1), ("heavy",)),
                        Entry("light", 400.0, SloBound(5.0, margin=0.1), ("light",))]

    def cores_used(self, model: str, k: Knobs, rate: float) -> float:
        cm = self.costs[model]
        b = max(1, min(k.items, math.ceil(rate * (k.delay_us / 1e6 + cm.t_ms(k.items) / 1e3))))
        return rate / b * cm.t_ms(b) / 1e3

    def run(self, n: int, phase: str, scale: float, configs: dict):
        from tritonkit.tuner.mix import MixRun

        figures, latencies, ratio, held = {}, {}, {}, True
        for e in self.entries:
            k, rate = configs[e.name], e.rps * scale
            others = sum(self.cores_used(m, configs[m], x.rps * scale) for m, x in
                         ((x.name, x) for x in self.entries) if m != e.name)
            p95 = self.costs[e.name].p95_ms(k.items, k.delay_us, rate, k.instances) / max(0.05, 1 - others / 2)
            p95 = None if math.isinf(p95) else round(p95, 3)
            figures[e.name] = {"rps": rate, "ok_rps": rate, "requests": 100, "p95_ms": p95, "error_ratio": 0.0,
                               "slo_ms": e.slo.p95_ms}
            latencies[e.name] = [] if p95 is None else [p95 * i / 95 for i in range(1, 101)]
            held &= e.slo.passes(p95, 0.0)
            ratio[e.name] = (p95 or math.inf) / e.slo.p95_ms
        return MixRun(n, phase, scale, {m: k.label() for m, k in configs.items()}, figures, held,
                      max(ratio, key=ratio.get), latencies)


def test_joint_tuning_moves_the_bottleneck_first_and_beats_the_configs_tuned_alone():
    """From configs that each suit their model alone (the light model on both cores, the heavy one
    unbatched), the mix search finds a higher common scale: it moves the bottleneck's knobs first,
    confirms with every entry's requests pooled, and never spends more than its budget."""
    from tritonkit.tuner.mix import MixSearch

    world = SimulatedMix()

    class WorldBox:  # MixBox's one call, answered by the simulated box
        @staticmethod
        def run(n, phase, scale, configs, entries, load):
            return world.run(n, phase, scale, configs)

    search = MixSearch(WorldBox(), world.entries, max_trials=40, load=Load(rate=1.0, duration_s=3),
                       bounds={"heavy": 16, "light": 16}, log=lambda s: None)
    start = {"heavy": Knobs(1, 0, 1), "light": Knobs(1, 0, 2)}
    t = search.run(start)
    assert t.start_scale > 0 and t.confirmed and t.scale > t.start_scale * RULES.rate_step
    first_move = next(r for r in search.runs if r.phase == "move")
    assert first_move.configs["heavy"] != start["heavy"].label()  # the bottleneck's model moved first
    assert len(search.runs) <= 40
    assert all(f["p95_ms"] <= f["slo_ms"] for f in t.confirmation.values())


def test_pairs_within_the_noise_decide_nothing():
    """The confirmation's start-beside-winner pairs: a 2% gap on a box whose runs swing by 20% is no
    verdict, nor are two runs that both failed outright; only clear pairs count for either side."""
    inf = math.inf
    assert clear_wins([(22.4, 21.9), (inf, inf)], log_sd=0.2) == (0, 0)
    assert clear_wins([(157.4, 96.0), (8.1, 47.8), (22.4, 21.9)], log_sd=0.2) == (1, 0)  # one clear pair
    assert clear_wins([(30.0, 10.0), (31.0, 10.5), (8.0, 40.0)], log_sd=0.2) == (1, 2)
    assert clear_wins([(30.0, 10.0)], log_sd=1.2) == (0, 0)  # on a box that noisy, 3x says nothing
    assert clear_wins([(inf, 12.0)], log_sd=1.2) == (0, 1)  # a run that failed outright loses


def test_the_in_flight_limit_is_the_largest_closed_loop_that_held_and_one_miss_cuts_nothing():
    """Bisection below Little's bound: closed loops up to 9 hold the SLO, 10 and more miss. A burst
    that fails 7 once does not cut the limit; a second miss at 15 does."""
    from tritonkit.tuner.in_flight import InFlightBound

    burst = {7}
    search, asked = InFlightBound(upper=29), []
    while (n := search.ask()) is not None:
        asked.append(n)
        held = n <= 9 and n not in burst
        burst.discard(n)
        search.tell(n, held)
    assert search.limit == 9
    assert asked[:3] == [15, 15, 7] and asked.count(7) == 2  # each miss measured once more
    assert len(asked) <= 12  # bisection, not a walk up from one
    none = InFlightBound(upper=4)
    while (n := none.ask()) is not None:
        none.tell(n, False)
    assert none.limit == 1  # nothing held: one in flight, the rest refused
