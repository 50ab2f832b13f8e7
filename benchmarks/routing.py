"""`tritonkit bench routing`: where the router sends requests, over a real network delay.

Two real tritonservers serve the same model: the edge, reached directly, and the "cloud",
reached through a delay link (delay_link.py: every chunk `delay_ms` late each way). Requests go
through an AsyncRouter, a fixed number in flight (closed loop). The cases:

- healthy edge: the share of requests answered by the edge;
- slow edge (its batcher waits 80 ms for a batch that never fills): the share to the edge;
- step, `runs` times: healthy, slow, healthy again; the share per second, and the time to move off
  the edge once it is slow and back once it recovered;
- edge killed mid-run: requests answered of those sent.

The edge slows down for real: its model is reloaded through model control with the longer
batching wait (`reconfigure`, the wiring passes tuner/apply.py's verified load) and back. A change
counts from the moment Triton logs that the reloaded model serves (the load call can return a
second later, once the old model is unloaded), and each phase lasts
`phase_s` from then. The time to switch is from the change until the router settled: every quarter second over the
next second sent at least 80% of its requests to the better endpoint (explorations make up the rest).
It is looked for before the next reload: a reload's own CPU slows both servers on one machine,
and the router rightly follows that.
Figures are measured in this one run and printed, never asserted.
"""

from __future__ import annotations

import asyncio
import bisect
import datetime
import itertools
import json
import math
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable
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
SETTLE_S = 1.0  # switched: every quarter second sent mostly to the better endpoint for this long
# Triton's log line for a model that now serves: I<MMDD> <HH:MM:SS.ffffff> <pid> model_lifecycle.cc:<n>] ...
LOADED = re.compile(r"^I(\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+) \d+ model_lifecycle\.cc:\d+\] "
                    rf"\"?successfully loaded '{MODEL}'", re.MULTILINE)
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


# driver(sent, t0): runs beside the senders (`sent` grows as requests are answered; t0 is the
# run's start on time.monotonic()); the run ends when it returns, and its result is kept
Driver = Callable[[list, float], Awaitable[dict]]


async def closed_loop(router: AsyncRouter, inputs: dict, concurrency: int, *, requests: int | None = None,
                      driver: Driver | None = None) -> tuple[list[Sent], dict]:
    """`concurrency` senders through the router until `requests` were sent and the driver (if
    any) returned, or, without `requests`, until the driver returned. The sends, sorted, and what
    the driver returned."""
    t0 = time.monotonic()
    sent: list[Sent] = []
    left = requests if requests is not None else math.inf
    stop = asyncio.Event()

    async def sender() -> None:
        nonlocal left
        while left > 0 and not stop.is_set():
            left -= 1
            at = time.monotonic()
            try:
                r = await router.infer_routed(MODEL, inputs)
                sent.append(Sent(at - t0, r.first, r.endpoint, (time.monotonic() - at) * 1e3))
            except TritonRequestError:
                sent.append(Sent(at - t0, None, None, None))

    async def drive() -> dict:
        try:
            return await driver(sent, t0) if driver else {}
        finally:
            if requests is None:
                stop.set()

    *_, marks = await asyncio.gather(*(sender() for _ in range(concurrency)), drive())
    return sorted(sent, key=lambda x: x.at), marks


def share(sent: list[Sent], url: str, answered_by: bool = False) -> float:
    """Of the answered requests, the share the router sent to `url` first (or that `url` answered)."""
    done = [s for s in sent if s.endpoint]
    hits = sum((s.endpoint if answered_by else s.first) == url for s in done)
    return round(hits / len(done), 4) if done else 0.0


def switch_time(sent: list[Sent], better: str, start: float, end: float) -> float | None:
    """Seconds from `start` until the router settled on `better`: the first request from which
    every SWITCH_WINDOW_S window starting within SETTLE_S sent at least SWITCH_SHARE of its
    requests there (explorations make up the rest). None if that never happened before `end`."""
    span = [s for s in sent if start <= s.at < end]
    at = [s.at for s in span]
    hits = list(itertools.accumulate((s.first == better for s in span), initial=0))
    bad = [0]  # running count of windows, by their first request, short of the share
    for i, t in enumerate(at):
        j = bisect.bisect_left(at, t + SWITCH_WINDOW_S)
        short = t + SWITCH_WINDOW_S > end or hits[j] - hits[i] < SWITCH_SHARE * (j - i)
        bad.append(bad[-1] + short)
    for i, t in enumerate(at):
        if t + SETTLE_S + SWITCH_WINDOW_S > end:
            return None
        j = bisect.bisect_left(at, t + SETTLE_S)
        if bad[j] == bad[i]:
            return round(t - start, 3)
    return None


def step_figures(sent: list[Sent], edge: str, cloud: str, marks: dict[str, float], total: float) -> dict:
    """One step run: the time to switch after each change, within its clean window (from when the
    change took effect until the next reload began: a reload's own CPU slows both servers on one
    machine, which the router rightly reacts to), and the share per second."""
    return {"marks_s": {k: round(v, 3) for k, v in marks.items()},
            "move_off_s": switch_time(sent, cloud, marks["slow"], marks["recover_started"]),
            "move_back_s": switch_time(sent, edge, marks["recovered"], total),
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
    onnx = sample_model.write(out_dir / "routing_mlp.onnx", width=1024, layers=4).resolve()
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

    async def put(config: mc.ModelConfig, t0: float) -> float:
        """Reload the edge with `config`; when Triton served it, in seconds since t0."""
        return await asyncio.to_thread(_reconfigure_seen, edge, reconfigure, config) - t0

    meta = await _meta(urls)
    x = meta.random_inputs(1, np.random.default_rng(0))
    cases: dict = {}

    async def fixed(name: str, requests: int, driver: Driver | None = None) -> list[Sent]:
        async with AsyncRouter(urls, RouterPolicy(), seed=0) as router:
            sent, _ = await closed_loop(router, x, s.concurrency, requests=requests, driver=driver)
        cases[name] = {"requests": len(sent), "answered": sum(1 for t in sent if t.endpoint),
                       "edge_share": share(sent, e_url), "edge_answered_share": share(sent, e_url, True),
                       "edge_p50_ms": _p50(sent, e_url), "cloud_p50_ms": _p50(sent, cloud_url)}
        log(f"== {name}: {cases[name]}")
        return sent

    log(f"== healthy edge: {s.requests} requests, {s.concurrency} in flight")
    await fixed("healthy", s.requests)
    log("== slow edge: reloaded with an 80 ms batching wait")
    await put(slow_cfg, 0.0)
    try:
        await fixed("slow", s.requests)
    finally:
        await put(healthy_cfg, 0.0)

    async def step(sent: list, t0: float) -> dict:
        """Healthy, slow, healthy again: each phase counted from when Triton served its config."""
        marks: dict[str, float] = {}
        await asyncio.sleep(s.phase_s)
        marks["slow_started"] = time.monotonic() - t0
        marks["slow"] = await put(slow_cfg, t0)
        try:
            await asyncio.sleep(max(0.0, marks["slow"] + s.phase_s - (time.monotonic() - t0)))
        finally:
            marks["recover_started"] = time.monotonic() - t0
            marks["recovered"] = await put(healthy_cfg, t0)  # the edge's own config again, whatever failed
        await asyncio.sleep(max(0.0, marks["recovered"] + s.phase_s - (time.monotonic() - t0)))
        marks["end"] = time.monotonic() - t0
        return marks

    steps = []
    for run in range(s.runs):
        log(f"== step run {run + 1}/{s.runs}: healthy, slow, healthy again, {s.phase_s:g} s each")
        async with AsyncRouter(urls, RouterPolicy(), seed=run) as router:
            sent, marks = await closed_loop(router, x, s.concurrency, driver=step)
            counters = router.counters()
        steps.append(step_figures(sent, e_url, cloud_url, marks, marks["end"]) | {"router": counters})
        _write_sends(out_dir / f"step_run{run + 1}.csv", sent, {e_url: "edge", cloud_url: "cloud"})
        log(f"   moved off in {steps[-1]['move_off_s']} s, back in {steps[-1]['move_back_s']} s; "
            f"edge share per second {steps[-1]['edge_share_per_s']}")
    cases["step"] = steps

    n = 2 * s.requests
    log(f"== edge killed mid-run: {n} requests, the edge SIGKILLed after a third of them")

    async def kill(sent: list, t0: float) -> dict:
        while len(sent) < n / 3:
            await asyncio.sleep(0.001)
        os.kill(edge.server.proc.pid, signal.SIGKILL)  # the edge this bench started, by its own pid
        return {"killed_after": len(sent)}

    await fixed("killed", n, kill)
    return {"schema": SCHEMA, "kind": "bench/routing", "cases": cases}


def _reconfigure_seen(server: Running, reconfigure: Reconfigure, config: mc.ModelConfig) -> float:
    """Put `config` in force; when Triton started serving it, on time.monotonic(). That is the time
    Triton logs "successfully loaded" for the model (the new model serves from then; the load call
    can return a second later, once the old one is unloaded); failing that, when the call returned."""
    log = server.server.log_path
    offset = log.stat().st_size
    with server.client() as c:
        reconfigure(c, MODEL, config)
    returned = time.monotonic()
    for _ in range(50):  # the line may reach the file a moment after the call returned
        with open(log, "rb") as f:
            f.seek(offset)
            found = LOADED.findall(f.read().decode(errors="replace"))
        if found:
            return _log_time(found[-1]) - (time.time() - time.monotonic())
        time.sleep(0.01)
    return returned


def _log_time(stamp: tuple[str, ...]) -> float:
    """Triton's log time (month, day, HH:MM:SS.ffffff, in local time) as a time.time() value."""
    month, day, clock = stamp
    moment = datetime.datetime.strptime(f"{datetime.date.today().year}-{month}-{day} {clock}", "%Y-%m-%d %H:%M:%S.%f")
    return moment.timestamp()


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
