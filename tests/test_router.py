"""The edge/remote router over real tritonservers serving the same model, one made slower.

The slow server's batcher waits up to 20 ms for a preferred batch of 8 that one request at a time
never fills, so each of its requests costs ~20 ms against ~1 ms on the fast one. Degrading the
fast one is a reload through model control with an even longer wait (Client.load(model, config)).
The `lag` model waits 80 ms on the slow server and not at all on the fast one; with the fast one
reached through a delay link of 15 ms each way (30 ms round trip, loadtests/delay_link.py) they
are a slow edge and a cloud.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from tests.conftest import tritonkit, write_spec
from tritonkit.clients import AsyncRouter, Router, RouterPolicy
from tritonkit.clients.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from tritonkit.loadtests.delay_link import DelayLink
from tritonkit.loadtests.load import Load
from tritonkit.loadtests.routed import route_requests
from tritonkit.stats import inference_count

pytestmark = [pytest.mark.server, pytest.mark.measures]

MODEL = "mlp"
FAST = {"max_queue_delay_us": 0}
SLOW = {"max_queue_delay_us": 20000, "preferred_batch_sizes": [8]}
VICTIM = {"max_queue_delay_us": 8000, "preferred_batch_sizes": [8]}
LAG = "lag"  # 80 ms of batching wait on the slow server (4 in flight never fill 8), none on the fast one
LINK_MS = 15.0  # each way


def _spec(batching: dict, lag: dict | None = None) -> dict:
    lag_model = [{"name": LAG, "onnx": "onnx/mlp.onnx", "max_batch_size": 8, "batching": lag}] if lag else []
    return {"models": [{"name": MODEL, "onnx": "onnx/mlp.onnx", "max_batch_size": 8, "batching": batching},
                       {"name": "cached", "onnx": "onnx/mlp.onnx", "max_batch_size": 8, "response_cache": True},
                       *lag_model],
            "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0}}


@contextlib.contextmanager
def _server(root, name: str, batching: dict, models: list[str] | None = None, lag: dict | None = None):
    from tritonkit.configs.generate import generate
    from tritonkit.configs.loader import load_spec
    from tritonkit.serving import running

    d = root / name
    d.mkdir()
    (d / "onnx").symlink_to(root / "onnx")
    spec_path = write_spec(d, _spec(batching, lag))
    generate(load_spec(spec_path, d / "repo"), d / "repo")
    with running(load_spec(spec_path), d / "repo", d / "state", models=models) as r:
        yield r


@pytest.fixture(scope="module")
def pair(tmp_path_factory, onnx_dir):
    """Two real servers, and the fast one also behind a delay link (`far`); each server and the
    link are stopped by their own pids when the module ends."""
    root = tmp_path_factory.mktemp("router")
    (root / "onnx").symlink_to(onnx_dir)
    with _server(root, "fast", FAST, lag=FAST) as fast, \
            _server(root, "slow", SLOW, lag={"max_queue_delay_us": 80000, "preferred_batch_sizes": [8]}) as slow, \
            DelayLink(fast.endpoints.grpc, LINK_MS) as link:
        yield SimpleNamespace(root=root, fast=fast, slow=slow, f=fast.endpoints.grpc, s=slow.endpoints.grpc,
                              far=link.url)


def _shares(results) -> dict[str, float]:
    return {url: sum(r.endpoint == url for r in results) / len(results) for url in {r.endpoint for r in results}}


def _inputs(router, n: int, seed: int = 0) -> list[dict]:
    meta = router.metadata(MODEL)
    rng = np.random.default_rng(seed)
    return [meta.random_inputs(1, rng) for _ in range(n)]


def test_breaker_opens_after_consecutive_failures_and_tries_again():
    now = [0.0]
    b = CircuitBreaker(failures=3, cooldown_s=2.0, clock=lambda: now[0])
    b.failure(), b.failure(), b.success(), b.failure(), b.failure()
    assert b.state == CLOSED  # a success in between resets the count
    b.failure()
    assert b.state == OPEN and not b.acquire() and b.trips == 1
    now[0] = 2.0
    assert b.state == HALF_OPEN and b.acquire()
    assert not b.acquire()  # one probe at a time
    b.failure()
    assert b.state == OPEN and b.trips == 2  # the try failed: another cool-down
    now[0] = 4.5
    assert b.acquire()
    b.success()
    assert b.state == CLOSED


def test_identical_means_same_model_priority_and_input_dtype_shape_and_bytes():
    from tritonkit.clients.coalesce import request_key

    x = np.arange(4, dtype=np.float32)
    key = request_key(MODEL, {"input": x})
    assert key == request_key(MODEL, {"input": x.copy()})
    assert len({key, request_key("other", {"input": x}), request_key(MODEL, {"input": x}, priority=1),
                request_key(MODEL, {"input": x.view(np.int32)}), request_key(MODEL, {"input": x.reshape(2, 2)}),
                request_key(MODEL, {"other": x})}) == 6
    words = np.array([b"a", b"bc"], dtype=np.object_)
    assert request_key(MODEL, {"t": words}) != request_key(MODEL, {"t": np.array([b"ab", b"c"], dtype=np.object_)})


def test_most_requests_go_to_the_faster_server(pair):
    """The edge (listed first) is the slow one: its P95 + RTT loses to the remote's."""
    with Router([pair.s, pair.f]) as router:
        results = [router.infer_routed(MODEL, x) for x in _inputs(router, 200)]
        counters = router.counters()
    shares = _shares(results)
    print("shares", shares, {u: (c["sent"], c["service_ms"], c["rtt_ms"])
                             for u, c in counters["endpoints"].items()})
    assert counters["ok"] == 200 and not counters["errors"]
    assert shares[pair.f] > 0.75  # most traffic ...
    assert shares.get(pair.s, 0) > 0  # ... and the slow one measured at the start, then explored now and then
    slow, fast = counters["endpoints"][pair.s], counters["endpoints"][pair.f]
    assert slow["service_ms"] > 2 * fast["service_ms"]  # its 20 ms batching wait shows
    assert fast["rtt_ms"] is not None and slow["rtt_ms"] is not None


def test_traffic_shifts_when_the_fast_server_degrades_and_back_when_it_recovers(pair):
    with pair.fast.client() as control, Router([pair.f, pair.s]) as router:
        xs = _inputs(router, 300)
        before = [router.infer_routed(MODEL, x) for x in xs[:100]]
        cfg = control.config(MODEL)
        slow_cfg = type(cfg)()
        slow_cfg.CopyFrom(cfg)
        slow_cfg.dynamic_batching.max_queue_delay_microseconds = 80000
        slow_cfg.dynamic_batching.preferred_batch_size[:] = [8]
        try:
            control.load(MODEL, slow_cfg)  # the fast server now holds each request ~80 ms
            degraded = [router.infer_routed(MODEL, x) for x in xs[100:]]
        finally:
            # its own config again (a load without one would find the files unchanged and keep the override)
            control.load(MODEL, cfg)
        assert control.config(MODEL).dynamic_batching.max_queue_delay_microseconds == 0
        # recovered: exploration re-measures it, and its slow samples age out of the window
        recovered, t0 = [], time.monotonic()
        while time.monotonic() - t0 < 12 and _shares(recovered[-50:] or degraded).get(pair.f, 0) < 0.9:
            recovered += [router.infer_routed(MODEL, x) for x in xs[:25]]
        took = time.monotonic() - t0
        counters = router.counters()
    b, d, r = _shares(before), _shares(degraded[50:]), _shares(recovered[-50:])  # once the router noticed
    print(f"before {b} degraded {d} recovered {r} after {took:.1f} s; fast {counters['endpoints'][pair.f]}")
    assert b[pair.f] > 0.8
    assert d.get(pair.s, 0) > 0.8
    assert r.get(pair.f, 0) >= 0.9
    assert counters["ok"] == counters["requests"]  # the switches cost no request


def test_no_request_lost_when_a_server_is_killed_mid_load(pair):
    """SIGKILL the edge taking most of an open-loop load, the cloud 30 ms away: every request is
    still answered."""
    from tritonkit.loadtests.routed import measure_router

    # ~8 ms a request: still preferred over the cloud, and often busy when it dies
    with _server(pair.root, "victim", VICTIM, models=[MODEL]) as victim:
        v = victim.endpoints.grpc
        killer = threading.Timer(2.0, os.kill, (victim.server.proc.pid, signal.SIGKILL))
        killer.start()
        try:
            result = measure_router([v, pair.far], MODEL, Load(rate=80, duration_s=3.0, warmup_s=0.5, drain_s=5))
        finally:
            killer.cancel()
        assert not victim.server.alive()
    overall, sec = result["overall"], result["router"]
    ev, es = sec["endpoints"][v], sec["endpoints"][pair.far]
    print(json.dumps({"overall": {k: overall[k] for k in ("requests", "ok", "errors")}, "retries": sec["retries"],
                      "victim": ev, "survivor": es}))
    assert overall["requests"] > 180
    assert overall["ok"] == overall["requests"] and not overall["errors"]
    assert sec["ok"] == sec["requests"] == overall["requests"]
    assert ev["answered"] > 0 and es["answered"] > 0  # both served: before and after the kill
    assert ev["answered"] + es["answered"] == overall["requests"]
    assert ev["failed"] >= 1 and sec["retries"] == ev["failed"] == es["retried_to"]  # each failure retried
    assert ev["breaker_trips"] >= 1 and ev["breaker"] != "closed"
    assert ev["triton_inferences"] is None  # the dead server's statistics are gone, not negative
    assert result["server"]["requests"] > 0  # Triton's side summed over the surviving endpoint


def test_over_a_real_link_a_slow_edge_loses_to_the_cloud_and_a_healthy_one_wins(pair):
    """With a real 30 ms round trip: an edge whose batcher waits 80 ms against the cloud
    over the link, then a healthy edge against the same cloud; 300 requests, 4 in flight each."""
    slow = route_requests([pair.s, pair.far], LAG, 300, concurrency=4)
    healthy = route_requests([pair.f, pair.far], MODEL, 300, concurrency=4)
    for name, sec in (("slow", slow), ("healthy", healthy)):
        print(name, {e["role"]: (e["share"], e["p50_ms"], e["service_ms"], e["rtt_ms"], e["explored"])
                     for e in sec["endpoints"].values()})
    for sec in (slow, healthy):
        assert sec["ok"] == sec["requests"] == 300
        assert sec["endpoints"][pair.far]["rtt_ms"] > 2 * LINK_MS  # the link's delay is real, both ways
    # Measured: 5% to the slow edge (its first requests, then probes), 99.7%
    # to the healthy one. The bounds are wide because the healthy run lasts ~0.3 s: one stall of this
    # busy machine then moves a few dozen requests to the cloud, rightly (seen: 80%). The decisions
    # themselves are checked to the 20% and 95% on a fake clock (test_decisions.py).
    assert slow["endpoints"][pair.s]["share"] <= 0.35
    assert healthy["endpoints"][pair.f]["share"] >= 0.7


async def _settled_statistics(router, quiet_s: float = 0.5, limit_s: float = 10.0) -> dict:
    """The statistics once they stop moving: Triton counts a request after its answer is sent, so a
    read right after the last answer can miss the last few (seen: 115 of 120)."""
    def counts(stats: dict) -> list:
        return [(e or {}).get("inference_count") for e in stats["endpoints"].values()]

    last = await router.statistics(MODEL)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet_s)
        now = await router.statistics(MODEL)
        if counts(now) == counts(last):
            return now
        last = now
    return last


def test_duplicates_share_one_inference_and_triton_counts_drop_by_their_share(pair):
    """60 distinct inputs, each sent twice at once (50% duplicates): Triton infers 60 times with
    coalescing, 120 without, and every answer equals a direct call to one server."""
    async def send(coalesce: bool) -> tuple[list, int, dict]:
        async with AsyncRouter([pair.f, pair.s], coalesce=coalesce) as router:
            meta = await router.metadata(MODEL)
            rng = np.random.default_rng(7)
            xs = [meta.random_inputs(1, rng) for _ in range(60)]
            before = await router.statistics(MODEL)
            outs = await asyncio.gather(*(router.infer_routed(MODEL, x) for x in xs for _ in range(2)))
            after = await _settled_statistics(router)
            n = sum(inference_count(before["endpoints"][u], after["endpoints"][u]) for u in (pair.f, pair.s))
            return list(zip([x for x in xs for _ in range(2)], outs)), n, router.counters()

    pairs, coalesced_n, counters = asyncio.run(send(True))
    _, plain_n, _ = asyncio.run(send(False))
    print("inferences coalesced", coalesced_n, "plain", plain_n, counters["coalesce"])
    assert counters["ok"] == 120 and counters["coalesce"] == {"requests": 120, "hits": 60, "hit_rate": 0.5}
    assert sum(r.coalesced for _, r in pairs) == 60
    assert plain_n == 120 and coalesced_n == 60
    with pair.fast.client() as direct:
        for x, r in pairs[::7]:
            want = direct.infer(MODEL, x)
            assert set(r.outputs) == set(want)
            for name in want:
                np.testing.assert_allclose(r.outputs[name], want[name], rtol=1e-5, atol=1e-6)


def test_hedges_stay_within_their_budget(pair):
    policy = RouterPolicy(hedge_budget=0.2, hedge_after_s=0.0)  # every request would like a hedge
    with Router([pair.f, pair.s], policy) as router:
        for x in _inputs(router, 100):
            router.infer(MODEL, x)
        c = router.counters()
    hedged = sum(e["hedged"] for e in c["endpoints"].values())
    print("hedges", c["hedges"], {u: (e["hedged"], e["cancelled"]) for u, e in c["endpoints"].items()})
    assert c["ok"] == 100 and 15 <= c["hedges"] == hedged <= 20


def test_loadtest_through_the_router_reports_each_endpoint(pair, tmp_path):
    r = tritonkit("loadtest", "--router", f"{pair.f},{pair.s}", "--model", MODEL, "--users", "8",
                  "--duration", "2", "--warmup", "0.5", "--coalesce", "--duplicates", "0.5", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    assert "router: 2 endpoint(s)" in r.stdout and pair.f in r.stdout and pair.s in r.stdout
    result = json.loads((tmp_path / "result.json").read_text())
    sec, overall = result["router"], result["overall"]
    assert overall["ok"] == overall["requests"] > 100
    assert abs(sum(e["share"] for e in sec["endpoints"].values()) - 1) < 1e-3
    assert sec["endpoints"][pair.f]["share"] > 0.5 and sec["endpoints"][pair.f]["p95_ms"] is not None
    co = sec["coalesce"]
    assert co["enabled"] and co["hit_rate"] > 0.25
    # duplicates answered by another request's inference never reached Triton
    assert sec["triton_inferences"] < 0.85 * overall["ok"]
    assert result["server"]["requests"] == sec["triton_inferences"]  # Triton's side, summed over both


def test_route_command_shows_shares_and_triton_cache_hits(pair, tmp_path):
    """Sequential repeats never overlap, so single-flight cannot help; Triton's response cache does."""
    out = tmp_path / "route.json"
    r = tritonkit("route", "--endpoints", f"{pair.f},{pair.s}", "--model", "cached", "--requests", "80",
                  "--concurrency", "1", "--duplicates", "0.75", "--json", str(out))
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    sec = json.loads(out.read_text())
    assert sec["ok"] == sec["requests"] == 80
    assert sum(e["cache_hits"] for e in sec["endpoints"].values()) > 30
    assert "cache" in r.stdout.splitlines()[1]


@pytest.mark.parametrize("args, flag", [
    (["loadtest", "--router", "127.0.0.1", "--model", "m", "--users", "1"], "--router"),
    (["loadtest", "--router", "127.0.0.1:1,127.0.0.1:1", "--model", "m", "--users", "1"], "--router"),
    (["loadtest", "--model", "m", "--users", "1", "--duplicates", "0.5"], "--coalesce/--duplicates"),
    (["loadtest", "--router", "127.0.0.1:1", "--engine", "locust", "--model", "m", "--users", "1"], "--engine"),
    (["route", "--endpoints", "127.0.0.1:1", "--model", "m", "--hedge", "2"], "--hedge"),
    (["route", "--endpoints", "127.0.0.1:1", "--model", "m", "--duplicates", "1"], "--duplicates"),
    (["bench", "routing", "--runs", "0"], "--runs"),
])
def test_bad_router_flags_exit_2_naming_the_flag(args, flag):
    r = tritonkit(*args)
    assert r.returncode == 2, r.stderr
    assert flag in r.stderr and "fix:" in r.stderr and "Traceback" not in r.stderr


def test_unreachable_endpoints_fail_with_one_line(tmp_path):
    from tritonkit.server import free_port

    r = tritonkit("route", "--endpoints", f"127.0.0.1:{free_port()}", "--model", "m", "--requests", "1")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("tritonkit: error:") and len(r.stderr.strip().splitlines()) == 1


def test_the_router_waits_out_a_deadline_then_says_so(pair):
    """A deadline shorter than the slow server's batching wait: a typed, counted failure."""
    from tritonkit.clients import DeadlineExceededError

    with Router([pair.s], RouterPolicy(deadline_s=0.005)) as router:
        x = _inputs(router, 1)[0]
        t0 = time.perf_counter()
        with pytest.raises(DeadlineExceededError) as e:
            router.infer(MODEL, x)
        # it gave up at its own short deadline, long before the policy's default one
        assert time.perf_counter() - t0 < RouterPolicy().deadline_s / 2 and e.value.kind == "deadline"
        assert router.counters()["errors"] == {"deadline": 1}
