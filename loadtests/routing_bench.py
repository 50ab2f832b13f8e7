"""`tritonkit bench routing`: where the router sends requests, over a real network delay.

Two real tritonservers serve the same model: the edge, reached directly, and the "cloud",
reached through a delay link (delay_link.py: every chunk `delay_ms` late each way). Requests go
through an AsyncRouter, a fixed number in flight (closed loop). The cases of issue #17:

- healthy edge: the share of requests answered by the edge;
- slow edge (its batcher waits 80 ms for a batch that never fills): the share to the edge;
- step, `runs` times: healthy, slow, healthy again; the share per second, and the time to move off
  the edge once it is slow and back once it recovered;
- edge killed mid-run: requests answered of those sent.

The edge slows down for real: its model is reloaded through model control with the longer
batching wait (`reconfigure`, the wiring passes tuner/apply.py's verified load) and back. A change
counts from the moment Triton first reports the new config (polled every 5 ms while it reloads; the
load call itself returns only after the old model is unloaded, a second or more later). The time to
switch is from then until every later quarter second sends at least 80% of its requests to the
better endpoint (probes make up the rest).
Figures are measured in this one run and printed, never asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from tritonclient.grpc import model_config_pb2 as mc

from tritonkit import sample_model
from tritonkit.clients import AsyncRouter, Client, RouterPolicy, TritonRequestError
from tritonkit.configs.generate import generate
from tritonkit.configs.loader import load_spec
from tritonkit.errors import InputError, flag_problem
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.delay_link import DelayLink
from tritonkit.loadtests.results import SCHEMA
from tritonkit.serving import Running, running
from tritonkit.stats import percentile

MODEL = "routed"
SLOW_DELAY_US = 80_000  # the slow edge's batching wait; a preferred batch of 8 never fills at 4 in flight
SWITCH_WINDOW_S = 0.25
SWITCH_SHARE = 0.8

# reconfigure(client, model, config): put `config` in force on a live server and verify it
Reconfigure = Callable[[Client, str, mc.ModelConfig], None]


@dataclass(frozen=True)
class Sent:
    at: float  # seconds since the run started, when the request was sent
    first: str | None  # the endpoint the router chose for it (None: not answered)
    endpoint: str | None  # the endpoint that answered it, after any retry (None: not answered)
    latency_ms: float | None


@dataclass(frozen=True)
class BenchSettings:
    runs: int = 3
    requests: int = 300
    concurrency: int = 4
    delay_ms: float = 15.0
    phase_s: float = 3.0  # each phase of a step run: healthy, slow, healthy again

    @classmethod
    def from_flags(cls, runs: int, requests: int, concurrency: int, delay_ms: float, phase_s: float) -> BenchSettings:
        checks = [(f"--runs {runs}", runs >= 1, "give at least 1 step run, e.g. 3"),
                  (f"--requests {requests}", requests >= 20, "give at least 20 requests per case, e.g. 300"),
                  (f"--concurrency {concurrency}", 1 <= concurrency <= 7,
                   "give 1..7 requests in flight (8 would fill the slow edge's batch), e.g. 4"),
                  (f"--delay-ms {delay_ms:g}", 0 <= delay_ms <= 1000, "give a one-way delay in ms, e.g. 15"),
                  (f"--phase-s {phase_s:g}", phase_s >= 1, "give at least 1 s per phase, e.g. 3")]
        problems = [flag_problem(flag, fix) for flag, ok, fix in checks if not ok]
        if problems:
            raise InputError(problems)
        return cls(runs, requests, concurrency, delay_ms, phase_s)


def bench_spec(folder: Path, onnx: Path, slow: bool) -> Path:
    batching = {"max_queue_delay_us": SLOW_DELAY_US if slow else 0, "preferred_batch_sizes": [8]}
    path = folder / "deploy.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"models": [{"name": MODEL, "onnx": str(onnx), "max_batch_size": 8,
                                                "batching": batching}],
                                    "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0}}))
    return path


def _served(folder: Path, onnx: Path, log):
    spec = load_spec(bench_spec(folder, onnx, slow=False), folder / "repo")  # the bench's own spec
    generate(spec, folder / "repo")
    return running(spec, folder / "repo", folder / "state", log=log)


def batching_wait(config: mc.ModelConfig, delay_us: int) -> mc.ModelConfig:
    out = mc.ModelConfig()
    out.CopyFrom(config)
    out.dynamic_batching.max_queue_delay_microseconds = delay_us
    return out


async def closed_loop(router: AsyncRouter, inputs: dict, concurrency: int, *, requests: int | None = None,
                      seconds: float | None = None, actions: list[tuple[float, Callable[[], object]]] = (),
                      ) -> tuple[list[Sent], dict[str, tuple[float, float]]]:
    """`concurrency` senders through the router until `requests` were sent or `seconds` passed.
    Each action (at, fn) runs fn in a thread once `at` seconds passed (or, with `requests`, once
    that share of them was sent); returns the sends and, per action name, when it started and took
    effect (seconds since the start)."""
    t0 = time.monotonic()
    sent: list[Sent] = []
    done: dict[str, tuple[float, float]] = {}
    left = requests if requests is not None else float("inf")

    def more() -> bool:
        return left > 0 and (seconds is None or time.monotonic() - t0 < seconds)

    async def sender() -> None:
        nonlocal left
        while more():
            left -= 1
            at = time.monotonic()
            try:
                r = await router.infer_routed(MODEL, inputs)
                sent.append(Sent(at - t0, r.first, r.endpoint, (time.monotonic() - at) * 1e3))
            except TritonRequestError:
                sent.append(Sent(at - t0, None, None, None))

    async def act(at: float, fn) -> None:
        if requests is not None:
            while len(sent) < at * requests:
                await asyncio.sleep(0.001)
        else:
            await asyncio.sleep(max(0.0, at - (time.monotonic() - t0)))
        started = time.monotonic() - t0
        result = await asyncio.to_thread(fn)
        # an action may say when it took effect (a time.monotonic()); else when it returned
        done[fn.__name__] = (started, (result if isinstance(result, float) else time.monotonic()) - t0)

    await asyncio.gather(*(sender() for _ in range(concurrency)), *(act(at, fn) for at, fn in actions))
    return sorted(sent, key=lambda s: s.at), done


def share(sent: list[Sent], url: str, answered_by: bool = False) -> float:
    """Of the answered requests, the share the router sent to `url` first (or that `url` answered)."""
    done = [s for s in sent if s.endpoint]
    hits = sum((s.endpoint if answered_by else s.first) == url for s in done)
    return round(hits / len(done), 4) if done else 0.0


def switch_time(sent: list[Sent], better: str, start: float, end: float) -> float | None:
    """Seconds from `start` until every later SWITCH_WINDOW_S window (up to `end`) sent at least
    SWITCH_SHARE of its requests to `better`; None if that never held."""
    span = [s for s in sent if start <= s.at < end]
    last_bad = None
    for i, s in enumerate(span):
        if s.at + SWITCH_WINDOW_S > end:
            break
        window = [w for w in span[i:] if w.at < s.at + SWITCH_WINDOW_S]
        if sum(w.first == better for w in window) < SWITCH_SHARE * len(window):
            last_bad = i
    if last_bad is None:
        return 0.0
    if last_bad + 1 >= len(span) or span[last_bad + 1].at + SWITCH_WINDOW_S > end:
        return None
    return round(span[last_bad + 1].at - start, 3)


def step_figures(sent: list[Sent], edge: str, cloud: str, actions: dict[str, tuple[float, float]],
                 total: float) -> dict:
    """One step run: when each change took effect, the time to switch after it, shares per second."""
    slow_at, recovered_at = actions["slow_down"][1], actions["recover"][1]  # when Triton served each config
    return {"slow_at_s": round(slow_at, 3), "recovered_at_s": round(recovered_at, 3),
            "reloads_s": {k: [round(v, 3) for v in span] for k, span in actions.items()},
            "move_off_s": switch_time(sent, cloud, slow_at, recovered_at),
            "move_back_s": switch_time(sent, edge, recovered_at, total),
            "requests": len(sent), "answered": sum(1 for t in sent if t.endpoint),
            "edge_share_per_s": shares_per_second(sent, edge, total)}


def shares_per_second(sent: list[Sent], url: str, seconds: float) -> list[float | None]:
    out = []
    for k in range(int(seconds + 0.999)):
        in_bin = [s for s in sent if k <= s.at < k + 1 and s.endpoint]
        out.append(round(sum(s.first == url for s in in_bin) / len(in_bin), 3) if in_bin else None)
    return out


def _p50(sent: list[Sent], url: str) -> float | None:
    lat = [s.latency_ms for s in sent if s.endpoint == url]
    return round(percentile(lat, 50), 2) if lat else None


def run_routing_bench(out_dir: Path, settings: BenchSettings, reconfigure: Reconfigure,
                      log: Callable[[str], None] = print) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    s = settings
    onnx = sample_model.write(out_dir / "routing_mlp.onnx", width=1024, layers=4)
    with _served(out_dir / "edge", onnx, log) as edge, _served(out_dir / "cloud", onnx, log) as cloud, \
            DelayLink(cloud.endpoints.grpc, s.delay_ms) as link:
        log(f"edge {edge.endpoints.grpc}; cloud {cloud.endpoints.grpc} behind a link of {s.delay_ms:g} ms "
            f"each way at {link.url}")
        bench = asyncio.run(_cases(edge, link.url, s, reconfigure, out_dir, log))
    bench["settings"] = vars(s) | {"model": "MLP 4 x 1024x1024 FP32", "slow_delay_us": SLOW_DELAY_US,
                                   "link": "delay proxy on the loopback (no netem in this kernel)"}
    write_bytes_atomic(out_dir / "bench_routing.json", json.dumps(bench, indent=2).encode())
    log(format_routing_bench(bench))
    return bench


async def _cases(edge: Running, cloud_url: str, s: BenchSettings, reconfigure: Reconfigure, out_dir: Path,
                 log) -> dict:
    e_url = edge.endpoints.grpc
    urls = [e_url, cloud_url]
    with edge.client() as control:
        healthy_cfg = control.config(MODEL)
    slow_cfg = batching_wait(healthy_cfg, SLOW_DELAY_US)

    def slow_down() -> float:
        return _reconfigure_seen(edge, reconfigure, slow_cfg)

    def recover() -> float:
        return _reconfigure_seen(edge, reconfigure, healthy_cfg)

    meta = await _meta(urls)
    x = meta.random_inputs(1, np.random.default_rng(0))
    cases: dict = {}

    async def fixed(name: str, requests: int, actions=()) -> list[Sent]:
        async with AsyncRouter(urls, RouterPolicy(), seed=0) as router:
            sent, _ = await closed_loop(router, x, s.concurrency, requests=requests, actions=actions)
        cases[name] = {"requests": len(sent), "answered": sum(1 for t in sent if t.endpoint),
                       "edge_share": share(sent, e_url), "edge_answered_share": share(sent, e_url, True),
                       "edge_p50_ms": _p50(sent, e_url),
                       "cloud_p50_ms": _p50(sent, cloud_url)}
        log(f"== {name}: {cases[name]}")
        return sent

    log(f"== healthy edge: {s.requests} requests, {s.concurrency} in flight")
    await fixed("healthy", s.requests)
    log("== slow edge: reloaded with an 80 ms batching wait")
    await asyncio.to_thread(slow_down)
    try:
        await fixed("slow", s.requests)
    finally:
        await asyncio.to_thread(recover)

    steps = []
    for run in range(s.runs):
        log(f"== step run {run + 1}/{s.runs}: healthy {s.phase_s:g} s, slow {s.phase_s:g} s, healthy {s.phase_s:g} s")
        total = 3 * s.phase_s
        async with AsyncRouter(urls, RouterPolicy(), seed=run) as router:
            try:
                sent, at = await closed_loop(router, x, s.concurrency, seconds=total,
                                             actions=[(s.phase_s, slow_down), (2 * s.phase_s, recover)])
            except BaseException:
                await asyncio.to_thread(recover)  # the edge's own config again, whatever failed
                raise
            counters = router.counters()
        steps.append(step_figures(sent, e_url, cloud_url, at, total) | {"router": counters})
        _write_sends(out_dir / f"step_run{run + 1}.csv", sent, {e_url: "edge", cloud_url: "cloud"})
        log(f"   moved off in {steps[-1]['move_off_s']} s, back in {steps[-1]['move_back_s']} s; "
            f"edge share per second {steps[-1]['edge_share_per_s']}")
    cases["step"] = steps

    log(f"== edge killed mid-run: {2 * s.requests} requests, the edge SIGKILLed after a third of them")
    kill_at = 1 / 3

    def kill() -> None:
        os.kill(edge.server.proc.pid, signal.SIGKILL)  # the edge this bench started, by its own pid

    await fixed("killed", 2 * s.requests, actions=[(kill_at, kill)])
    return {"schema": SCHEMA, "kind": "bench/routing", "cases": cases}


def _reconfigure_seen(server: Running, reconfigure: Reconfigure, config: mc.ModelConfig,
                      poll_s: float = 0.005) -> float:
    """Put `config` in force and return when Triton first reported it (time.monotonic()): Triton
    serves the reloaded model from then on, while the load call returns only after the old one is
    unloaded, a second or more later on a busy machine."""
    want = config.dynamic_batching.max_queue_delay_microseconds
    seen: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        with server.client() as c:
            while not stop.is_set():
                with contextlib.suppress(TritonRequestError):
                    if c.config(MODEL).dynamic_batching.max_queue_delay_microseconds == want:
                        seen.append(time.monotonic())
                        return
                stop.wait(poll_s)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with server.client() as c:
            reconfigure(c, MODEL, config)
    finally:
        stop.set()
        watcher.join()
    return seen[0] if seen else time.monotonic()


def _write_sends(path: Path, sent: list[Sent], roles: dict[str, str]) -> None:
    rows = ["sent_s,first,answered_by,latency_ms"]
    for s in sent:
        latency = "" if s.latency_ms is None else f"{s.latency_ms:.2f}"
        rows.append(f"{s.at:.4f},{roles.get(s.first, '')},{roles.get(s.endpoint, '')},{latency}")
    write_bytes_atomic(path, ("\n".join(rows) + "\n").encode())


async def _meta(urls: list[str]):
    async with AsyncRouter(urls, RouterPolicy(), seed=0) as router:
        return await router.metadata(MODEL)


def format_routing_bench(bench: dict) -> str:
    c = bench["cases"]
    s = bench["settings"]
    rows = [f"edge vs cloud ({s['delay_ms']:g} ms each way), {s['concurrency']} in flight",
            f"{'case':<34}{'to the edge':>12}{'answered':>14}{'edge P50':>10}{'cloud P50':>10}"]
    for name, label in (("healthy", "healthy edge"), ("slow", "slow edge (80 ms batching wait)"),
                        ("killed", "edge killed mid-run")):
        k = c[name]
        rows.append(f"{label:<34}{k['edge_share']:>12.1%}{k['answered']:>8} of {k['requests']:<4}"
                    f"{_ms(k['edge_p50_ms'])}{_ms(k['cloud_p50_ms'])}")
    rows.append(f"step runs (phases of {s['phase_s']:g} s): time to move off the slowed edge, and back")
    for i, st in enumerate(c["step"], 1):
        per_s = " ".join("  -" if v is None else f"{v:.2f}" for v in st["edge_share_per_s"])
        rows.append(f"  run {i}: off {_s(st['move_off_s'])}, back {_s(st['move_back_s'])}; "
                    f"edge share per second: {per_s}")
    return "\n".join(rows)


def _ms(v: float | None) -> str:
    return f"{'-':>10}" if v is None else f"{v:>8.1f}ms"


def _s(v: float | None) -> str:
    return "never" if v is None else f"{v:.2f} s"
