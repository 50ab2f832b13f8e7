"""The decision logic of the tuner (offline search, online sidecar) and of the router, checked
without a server: a fixed cost model stands in for measurements and a fake clock for time, so
every outcome here is the same on any machine. The real-server tests check that the decisions
are carried out; these check that they are the right ones."""

from __future__ import annotations

import asyncio
import math
import os
from dataclasses import replace

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from tritonkit.clients import AsyncRouter, RouterPolicy
from tritonkit.clients.errors import UnavailableError
from tritonkit.loadtests.load import Load
from tritonkit.spec import QueuePolicy
from tritonkit.tuner.costmodel import CostModel
from tritonkit.tuner.knobs import Knobs, batch_sizes, grid
from tritonkit.tuner.offline import RATE_STEP, Objective, Search, predict_p95
from tritonkit.tuner.online import Controller, OnlineSettings, Window
from tritonkit.tuner.trials import Trial

SLO_MS = 25.0
# 2 ms per execution plus 0.5 ms per item: batching pays (8 items cost 6 ms, not 20 ms)
WORLD = CostModel(2.0, 0.5)


@pytest.fixture(autouse=True)
def two_cores(monkeypatch):
    """Instances and parallelism follow the core count: fix it, so the outcomes do not."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


# -- the offline search ------------------------------------------------------------------------

class _ModelSpec:
    class batching:  # noqa: N801 - the attribute path the search reads
        default_queue_policy = QueuePolicy(max_queue_size=128)


class SimulatedTrials:
    """What the search asks of `Trials`, answered by WORLD: a closed loop yields executions of
    min(clients, max batch) items; an open loop's P95 is the cost model's prediction at that rate."""

    model = "m"

    class spec:  # noqa: N801
        @staticmethod
        def model(name: str):
            return _ModelSpec

    def __init__(self, collapses: bool = False):
        self.trials: list[Trial] = []
        # Under more load than it can take, a config with a bounded queue either serves about its
        # capacity within the SLO and rejects the rest (healthy), or, as Triton 2.51's batcher
        # with a queue policy does, serves a fraction of it slowly (collapses).
        self.collapses = collapses

    def open_load(self, rate: float) -> Load:
        return Load(rate=rate, duration_s=3, warmup_s=0.5, drain_s=1)

    def closed_load(self, clients: int, seconds: float | None = None) -> Load:
        return Load(concurrency=clients, duration_s=seconds or 3, warmup_s=0.5, drain_s=1)

    def run(self, k: Knobs, load: Load, phase: str) -> Trial:
        t = Trial(len(self.trials) + 1, phase, k.label(), k.to_json(), load.describe(), load.rate)
        if load.rate is None:
            b, n = min(load.concurrency, k.items), 500
            stats = {"batch_stats": [{"batch_size": b, "compute_infer": {"count": n, "ns": n * WORLD.t_ms(b) * 1e6}}]}
            t.batch_stats, t.passed = ({}, stats), True
        elif k.queue is not None and predict_p95(WORLD, k, load.rate) > SLO_MS:
            # more than it serves within the SLO: the bounded queue rejects the rest
            capacity = best_sustained(replace(k, queue=None))
            served = 0.2 * capacity if self.collapses else capacity
            t.ok_rps, t.p95_ms = round(served, 1), 480.0 if self.collapses else 0.8 * SLO_MS
            t.error_ratio = round(1 - served / load.rate, 4)
            t.errors = {"queue_full": int(t.error_ratio * load.rate * 3)}
        else:
            p95 = predict_p95(WORLD, k, load.rate)
            t.p95_ms = None if math.isinf(p95) else round(p95, 3)
            t.passed = t.p95_ms is not None and t.p95_ms <= SLO_MS
            t.ok_rps = load.rate if t.p95_ms is not None else 0.0
        self.trials.append(t)
        return t


def best_sustained(k: Knobs) -> float:
    """The highest rate on the search's ladder at which WORLD meets the SLO with knobs k."""
    rate, best = 100.0 / RATE_STEP ** 10, 0.0
    while rate < 1e5:
        if predict_p95(WORLD, k, rate) <= SLO_MS:
            best = rate
        rate *= RATE_STEP
    return best


def test_offline_search_finds_near_the_grid_best_within_its_budget():
    sim = SimulatedTrials()
    spec_knobs = Knobs(16, 8000, 1)
    tuning = Search(sim, Objective(SLO_MS), bound=16, max_trials=30, log=lambda s: None).run(spec_knobs)
    grid_best = max(best_sustained(k) for k in grid(batch_sizes(16)))
    assert tuning.confirmed and tuning.best.passed
    assert tuning.best.rate >= 0.85 * grid_best, (tuning.best.rate, grid_best)
    assert tuning.best.rate >= tuning.baseline.rate  # never worse than the spec's own config
    assert len(sim.trials) <= 30
    assert [t.phase for t in sim.trials[:4]] == ["calibrate"] * 3 + ["baseline"]
    assert tuning.cost_model.c_fixed_ms == pytest.approx(2.0) and tuning.cost_model.c_per_ms == pytest.approx(0.5)
    # the winner carries the queue policy that protects the SLO, and it was checked under overload
    assert tuning.best.knobs.queue is not None and tuning.overload is not None
    assert tuning.overload.rate == pytest.approx(1.5 * tuning.best.rate)


@pytest.mark.parametrize("budget", [6, 9, 14])
def test_offline_search_never_exceeds_the_trial_budget(budget):
    sim = SimulatedTrials()
    Search(sim, Objective(SLO_MS), bound=16, max_trials=budget, log=lambda s: None).run(Knobs(16, 8000, 1))
    assert len(sim.trials) <= budget


def test_a_model_without_a_batch_axis_is_tuned_by_its_instances_alone():
    sim = SimulatedTrials()
    tuning = Search(sim, Objective(SLO_MS), bound=0, max_trials=20, log=lambda s: None).run(Knobs(0, 0, 1))
    assert tuning.confirmed and tuning.best.knobs.max_batch == 0 and tuning.best.knobs.queue is None
    assert all(t.knobs["max_batch_size"] == 0 and t.knobs["max_queue_delay_us"] == 0 for t in sim.trials)
    assert tuning.best.knobs.instances == 2  # two instances serve more than one on two cores
    assert tuning.overload is None  # no queue policy to check without dynamic batching


def test_a_queue_policy_that_collapses_under_overload_is_never_written():
    """The overload check is a gate: the same search in a world where the bounded queue collapses
    (as on Triton 2.51) confirms the winner without the policy, and says why."""
    healthy, collapsing = SimulatedTrials(), SimulatedTrials(collapses=True)
    kept = Search(healthy, Objective(SLO_MS), bound=16, max_trials=30, log=lambda s: None).run(Knobs(16, 8000, 1))
    dropped = Search(collapsing, Objective(SLO_MS), bound=16, max_trials=30, log=lambda s: None).run(
        Knobs(16, 8000, 1))
    assert kept.best.knobs.queue is not None and not kept.policy_note
    assert dropped.overload is not None and not dropped.overload.passed
    assert dropped.confirmed and dropped.best.knobs.queue is None
    assert "failed its overload check" in dropped.policy_note
    assert dropped.best.knobs == replace(kept.best.knobs, queue=None)  # the same winner, unprotected


def test_latency_objective_lowers_p95_at_the_target_rate():
    sim = SimulatedTrials()
    tuning = Search(sim, Objective(SLO_MS, rps=600), bound=16, max_trials=20, log=lambda s: None).run(
        Knobs(16, 8000, 1))
    base, best = tuning.baseline.trial, tuning.best.trial
    assert best.passed and best.rate == 600
    assert best.p95_ms < base.p95_ms / 2  # the spec's 8 ms wait is most of its P95 at this rate


# -- the online sidecar --------------------------------------------------------------------------

class ModelControl:
    """The two model-control calls the controller makes, kept in memory."""

    def __init__(self, cfg: mc.ModelConfig):
        self.cfg, self.loads = cfg, 0

    def config(self, model: str) -> mc.ModelConfig:
        return self.cfg

    def load(self, model: str, cfg: mc.ModelConfig) -> None:
        self.loads += 1
        self.cfg = cfg


def _controller(**settings) -> tuple[Controller, ModelControl]:
    cfg = mc.ModelConfig(name="online", max_batch_size=16)
    cfg.instance_group.add(count=2)
    cfg.dynamic_batching.max_queue_delay_microseconds = 20000
    cfg.dynamic_batching.preferred_batch_size.append(16)
    control = ModelControl(cfg)
    ctl = Controller(control, "online", 15.0, OnlineSettings(**settings), None, lambda s: None)
    ctl.cost = CostModel(2.0, 0.3)
    return ctl, control


def _window(ctl: Controller, t: float, rate: float, mean_ms: float) -> Window:
    dyn = ctl.config.dynamic_batching
    w = Window(t, rate, int(rate), mean_ms, mean_ms / 2, 4.0, 0.0, dyn.max_queue_delay_microseconds,
               list(dyn.preferred_batch_size))
    ctl.state.windows.append(w)
    return w


def test_online_setpoints_follow_the_rate_within_the_slo_budget():
    ctl, _ = _controller()
    assert ctl.setpoint(100) == (0, [])  # light load: no waiting
    delay, pref = ctl.setpoint(3000)
    assert delay > 0 and pref and pref[0] >= 4  # heavy load: fill batches
    assert delay / 1e3 + 2 * ctl.cost.t_ms(pref[0]) <= 15  # within the SLO budget
    batches = [(ctl.setpoint(r)[1] or [1])[0] for r in (100, 1000, 3000, 6000)]
    assert batches == sorted(batches)  # more traffic, larger batches


def test_online_needs_agreeing_windows_cools_down_and_rolls_back_a_worse_change():
    ctl, control = _controller(cooldown_s=10, settle_windows=2)
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
    ctl, control = _controller(cooldown_s=2, settle_windows=2)
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
    """An endpoint's client: answers after `latency_s` (or fails), counts what it got."""

    def __init__(self, latency_s: float = 0.001, fail: bool = False):
        self.latency_s, self.fail, self.calls = latency_s, fail, 0

    async def live(self) -> bool:
        return True

    async def infer(self, model, arrays, **kw):
        self.calls += 1
        await asyncio.sleep(self.latency_s)
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


def test_router_explores_only_endpoints_not_measured_recently():
    clock = Clock()
    router = _router(["edge:1", "cloud:1"], RouterPolicy(explore=0.5, explore_interval_s=0.2), clock)
    _measured(router, {"edge:1": 10.0, "cloud:1": 10.0}, {"edge:1": 0.2, "cloud:1": 30.0})
    assert {router._choose([]).url for _ in range(50)} == {"edge:1"}  # cloud was just measured
    clock.t += 1.0
    picks = [router._choose([]).url for _ in range(200)]
    assert 0.3 < picks.count("cloud:1") / len(picks) < 0.7  # stale now: explored at the set share


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
