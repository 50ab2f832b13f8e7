"""`tritonkit bench serving` (`make bench`): what serving through the kit costs against raw ONNX Runtime.

One run, side by side on this machine, the sample model at batch 1, 8 and the max batch:

- raw: the same ONNX Runtime session the runner opens (tritonkit/ort_session.py, same threads),
  called in this process in a loop on a batch of B, one caller per served instance; throughput
  B x calls/s.
- served: the kit's local tritonserver, one model per batch size with `max_batch_size: B` and the
  spec defaults otherwise (no queue delay), driven by 3B closed-loop gRPC clients per instance,
  one sample a request, so the dynamic batcher always has the next full batch waiting, as in
  production. Two clients send that load in turn: the kit's asyncio generator and NVIDIA's
  perf_analyzer (C++). On a small box the client shares the cores with the server, so the served
  figure is partly the client's cost; the C++ client's share is the smaller.
- light load: one client, one request at a time, batch 1: the latency the kit adds to raw ORT.

The served time per execution is broken down from Triton's statistics (queue, compute input,
infer, output) and from the runner's own counters (tritonkit/runner_timings.py: the time inside
`execute`, and inside it the ONNX Runtime call), so the cost of each part of the path is visible.
Figures are ratios and differences from this one run, never asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from tritonkit import runner_timings, sample_model
from tritonkit.configs.generate import generate
from tritonkit.configs.loader import load_spec
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.asyncgen import run_load
from tritonkit.loadtests.load import Load, RequestClass
from tritonkit.loadtests.pa_run import run_pa
from tritonkit.loadtests.results import SCHEMA
from tritonkit.ort_session import open_session
from tritonkit.serving import running
from tritonkit.stats import percentile

TARGETS = {"served_over_raw_at_max_batch_at_least": 0.9, "added_latency_batch1_ms_at_most": 0.5}
CLIENTS = ("asyncio", "perf_analyzer")
STAGES = ("compute_input", "compute_infer", "compute_output")


def model_name(batch: int) -> str:
    return f"mlp_b{batch}"


def bench_spec(folder: Path, batches: list[int], *, threads: int, instances: int, width: int, layers: int) -> Path:
    """The sample model served once per batch size (max_batch_size = B), on free ports."""
    onnx = folder / "edge_mlp.onnx"
    if not onnx.exists():
        sample_model.write(onnx, width=width, layers=layers)
    models = [{"name": model_name(b), "onnx": str(onnx.resolve()), "max_batch_size": b, "threads": threads,
               "instances": {"count": instances}} for b in batches]
    path = folder / "deploy.yaml"
    path.write_text(yaml.safe_dump({"models": models,
                                    "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0}}))
    return path


def raw_ort(sessions: list, feed_name: str, width: int, batch: int, seconds: float) -> dict:
    """Closed loop of session.run on one batch, one caller thread per session (as many as the served
    model has instances, each with the same ORT threads), after a short warm-up."""
    x = np.random.default_rng(0).standard_normal((batch, width), dtype=np.float32)
    feeds = {feed_name: x}
    times: list[list[float]] = [[] for _ in sessions]
    for session in sessions:
        for _ in range(3):
            session.run(None, feeds)

    def loop(session, out: list[float]) -> None:
        while (t0 := time.perf_counter()) < end:
            session.run(None, feeds)  # ORT releases the GIL: the callers run side by side
            out.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=loop, args=(s, t)) for s, t in zip(sessions, times)]
    start = time.perf_counter()
    end = start + seconds
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"batch": batch, "wall_s": time.perf_counter() - start, "times_s": [x for t in times for x in t]}


def _stage_sums(stats: dict) -> dict[str, int]:
    """Cumulative executions and ns per compute stage (batch_stats), queue ns and requests."""
    out = {"executions": 0, "samples": 0, **{f"{s}_ns": 0 for s in STAGES}}
    for b in stats.get("batch_stats", []):
        out["executions"] += int(b["compute_infer"]["count"])
        out["samples"] += int(b["compute_infer"]["count"]) * int(b["batch_size"])
        for s in STAGES:
            out[f"{s}_ns"] += int(b[s]["ns"])
    inference = stats.get("inference_stats", {})
    out["queue_ns"] = int(inference.get("queue", {}).get("ns", 0))
    out["requests"] = int(inference.get("success", {}).get("count", 0))
    return out


def served(url: str, model: str, timings_dir: Path, clients: int, seconds: float, client: str = "asyncio") -> dict:
    """Closed loop of `clients` gRPC clients, one sample a request, sent by `client` (asyncio or
    perf_analyzer): the latencies the clients saw, and Triton's and the runner's counters over the
    same window."""
    load = Load(concurrency=clients, duration_s=seconds, warmup_s=0.5)
    t0 = runner_timings.read(timings_dir, f"{model}_")
    if client == "perf_analyzer":
        out = run_pa(url, model, load, [RequestClass()], shared_memory=True, log=lambda s: None)
    else:
        out = asyncio.run(run_load(url, model, load, [RequestClass()]))
    runner = runner_timings.delta(t0, runner_timings.read(timings_dir, f"{model}_"))
    a, b = _stage_sums(out.stats_before), _stage_sums(out.stats_after)
    return {"wall_s": seconds, "latencies_s": [x.latency_s for x in out.samples if x.latency_s is not None],
            "errors": sum(1 for x in out.samples if x.latency_s is None), "cpu_percent": out.cpu_percent,
            "triton": {k: b[k] - a[k] for k in a}, "runner": runner}


def _raw_figures(slices: list[dict]) -> dict:
    times = [x for s in slices for x in s["times_s"]]
    batch = slices[0]["batch"]
    return {"rps": batch * len(times) / sum(s["wall_s"] for s in slices), "calls": len(times),
            "mean_ms": 1e3 * sum(times) / len(times), "p50_ms": 1e3 * percentile(times, 50)}


def _served_figures(slices: list[dict]) -> dict:
    lat = [x for s in slices for x in s["latencies_s"]]
    tr = {k: sum(s["triton"][k] for s in slices) for k in slices[0]["triton"]}
    rn = {k: sum(s["runner"][k] for s in slices) for k in slices[0]["runner"]}
    ex = tr["executions"]

    def per_exec(ns: int, n: int = ex) -> float | None:
        return ns / n / 1e6 if n else None

    return {"rps": len(lat) / sum(s["wall_s"] for s in slices), "ok": len(lat),
            "errors": sum(s["errors"] for s in slices),
            "p50_ms": 1e3 * percentile(lat, 50), "mean_ms": 1e3 * sum(lat) / len(lat) if lat else None,
            "executions": ex, "mean_batch": tr["samples"] / ex if ex else None,
            "cycle_ms": 1e3 * sum(s["wall_s"] for s in slices) / ex if ex else None,
            "queue_ms_per_request": tr["queue_ns"] / tr["requests"] / 1e6 if tr["requests"] else None,
            **{f"{st}_ms": per_exec(tr[f"{st}_ns"]) for st in STAGES},
            "runner": {"execute_ms": per_exec(rn["execute_ns"], rn["executes"]),
                       "ort_ms": per_exec(rn["ort_ns"], rn["executes"]),
                       "ort_calls_per_execute": rn["ort_calls"] / rn["executes"] if rn["executes"] else None},
            "generator_cpu_percent": max(s["cpu_percent"] for s in slices)}


def _rounds(rounds: int, raw_slice: Callable[[], dict], served_slices: dict[str, Callable[[], dict]]) -> dict:
    """Raw and served by each client in turns, so that a neighbour's load on a shared box falls on
    all alike."""
    raws: list[dict] = []
    serveds: dict[str, list[dict]] = {c: [] for c in served_slices}
    for _ in range(rounds):
        raws.append(raw_slice())
        for c, one in served_slices.items():
            serveds[c].append(one())
    raw = _raw_figures(raws)
    clients = {}
    for c, slices in serveds.items():
        srv = _served_figures(slices)
        per_round = [_served_figures([s])["rps"] / _raw_figures([r])["rps"] for r, s in zip(raws, slices)]
        # The headline is the median turn: one turn that a neighbour's burst hit moves it least.
        clients[c] = {"served": srv, "served_over_raw": statistics.median(per_round),
                      "served_over_raw_totals": srv["rps"] / raw["rps"], "per_round": [round(x, 3) for x in per_round]}
    return {"raw": raw, "clients": clients}


def run_serving_bench(out_dir: Path, *, max_batch: int = 16, threads: int = 1, instances: int = 1,
                      seconds: float = 5.0, rounds: int = 5, width: int = 2048, layers: int = 4,
                      log: Callable[[str], None] = print) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    batches = sorted({1, min(8, max_batch), max_batch})
    spec = load_spec(bench_spec(out_dir, batches, threads=threads, instances=instances, width=width,
                                layers=layers), out_dir / "repo")
    generate(spec, out_dir / "repo")
    timings_dir = out_dir / "runner_timings"
    onnx = str(spec.onnx_path(spec.models[0]))
    sessions = [open_session(onnx, threads) for _ in range(instances)]  # one per served instance
    feed = sessions[0].get_inputs()[0].name
    piece = seconds / rounds
    rows = []
    os.environ[runner_timings.ENV] = str(timings_dir)  # the server and its stubs inherit it
    try:
        with running(spec, out_dir / "repo", out_dir / "state", log=log) as r:
            url = r.endpoints.grpc
            for b in batches:
                # a full batch executing on each instance, the next one queued, and a third batch's worth
                # of clients between answer and next request (the generator shares the box)
                clients = 3 * b * instances
                log(f"== batch {b}: raw ONNX Runtime and served ({clients} clients) in {rounds} turns of "
                    f"{piece:g} s each")
                row = _rounds(rounds, lambda b=b: raw_ort(sessions, feed, width, b, piece),
                              {c: lambda b=b, n=clients, c=c: served(url, model_name(b), timings_dir, n, piece, c)
                               for c in CLIENTS})
                rows.append({"batch": b, **row})
                for c, x in row["clients"].items():
                    log(f"   raw {row['raw']['rps']:.0f} req/s, served by {c} {x['served']['rps']:.0f} req/s "
                        f"(mean batch {x['served']['mean_batch'] or 0:.1f}): {x['served_over_raw']:.2f} "
                        f"(turns: {', '.join(f'{v:.2f}' for v in x['per_round'])})")
            log(f"== light load: one client, batch 1, {rounds} turns of {piece:g} s each")
            light = _rounds(rounds, lambda: raw_ort(sessions[:1], feed, width, 1, piece),
                            {c: lambda c=c: served(url, model_name(max_batch), timings_dir, 1, piece, c)
                             for c in CLIENTS})
    finally:
        os.environ.pop(runner_timings.ENV, None)
    raw1 = light["raw"]
    latency = {"raw_p50_ms": raw1["p50_ms"], "raw_mean_ms": raw1["mean_ms"], "clients": {
        c: {"served_p50_ms": x["served"]["p50_ms"], "served_mean_ms": x["served"]["mean_ms"],
            "added_p50_ms": x["served"]["p50_ms"] - raw1["p50_ms"],
            "added_mean_ms": x["served"]["mean_ms"] - raw1["mean_ms"], "served": x["served"]}
        for c, x in light["clients"].items()}}
    bench = {"schema": SCHEMA, "kind": "bench/serving", "model": {"width": width, "layers": layers},
             "threads": threads, "instances": instances, "cores": os.cpu_count(), "seconds": seconds,
             "rounds": rounds, "rows": rows, "light_load": latency, "targets": TARGETS}
    write_bytes_atomic(out_dir / "bench_serving.json", json.dumps(bench, indent=2, default=str).encode())
    log(format_serving_bench(bench))
    return bench


def _ms(v: float | None) -> str:
    return f"{v:.2f}" if v is not None else "-"


def format_serving_bench(bench: dict) -> str:
    lines = [f"sample model, {bench['instances']} instance(s) x {bench['threads']} ORT thread(s), "
             f"{bench['cores']} cores, {bench['seconds']:g} s per side in {bench['rounds']} turns",
             f"{'batch':>5} {'client':<14}{'raw req/s':>10} {'served':>8} {'ratio':>6} {'m.batch':>7} | per execution, "
             f"ms: {'raw':>5} {'cycle':>6} {'input':>6} {'infer':>6} {'execute':>7} {'ORT':>6} {'output':>6}  turns"]
    for row in bench["rows"]:
        r = row["raw"]
        for c, x in row["clients"].items():
            s = x["served"]
            lines.append(f"{row['batch']:>5} {c:<14}{r['rps']:>10.0f} {s['rps']:>8.0f} {x['served_over_raw']:>6.2f} "
                         f"{s['mean_batch'] or 0:>7.1f} | {'':>19}{_ms(r['mean_ms']):>5} {_ms(s['cycle_ms']):>6} "
                         f"{_ms(s['compute_input_ms']):>6} {_ms(s['compute_infer_ms']):>6} "
                         f"{_ms(s['runner']['execute_ms']):>7} {_ms(s['runner']['ort_ms']):>6} "
                         f"{_ms(s['compute_output_ms']):>6}  {'/'.join(f'{v:.2f}' for v in x['per_round'])}")
    lat = bench["light_load"]
    top = bench["rows"][-1]
    t = bench["targets"]
    for c, x in lat["clients"].items():
        lines.append(f"batch 1, one {c} client: raw P50 {lat['raw_p50_ms']:.2f} ms, served P50 "
                     f"{x['served_p50_ms']:.2f} ms: added {x['added_p50_ms']:.2f} ms (mean: added "
                     f"{x['added_mean_ms']:.2f} ms)")
        lines.append(f"  served/raw at max batch {top['batch']} with {c}: {top['clients'][c]['served_over_raw']:.2f} "
                     f"(target >= {t['served_over_raw_at_max_batch_at_least']}); added latency at batch 1: "
                     f"{x['added_p50_ms']:.2f} ms (target <= {t['added_latency_batch1_ms_at_most']} ms)")
    return "\n".join(lines)
