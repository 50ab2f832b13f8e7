"""`tritonkit bench serving` (`make bench`): what serving through the kit costs against raw ONNX Runtime.

One run, side by side on this machine, the sample model at batch 1, 8 and the max batch:

- raw: the same ONNX Runtime session the runner opens (tritonkit/ort_session.py, same threads),
  called in this process in a loop on a batch of B, one caller per served instance; throughput
  B x calls/s.
- served: the kit's local tritonserver, one model per batch size with `max_batch_size: B` and the
  spec defaults otherwise (no queue delay), driven by 2B closed-loop gRPC clients per instance,
  one sample a request, so the dynamic batcher always has the next full batch waiting, as in
  production.
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
from tritonkit.loadtests.results import SCHEMA, build_result
from tritonkit.ort_session import open_session
from tritonkit.serving import running
from tritonkit.stats import percentile

TARGETS = {"served_over_raw_at_max_batch_at_least": 0.9, "added_latency_batch1_ms_at_most": 0.5}
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
    wall = time.perf_counter() - start
    every = [x for t in times for x in t]
    return {"batch": batch, "calls": len(every), "rps": batch * len(every) / wall,
            "mean_ms": 1e3 * sum(every) / len(every), "p50_ms": 1e3 * percentile(every, 50)}


def _per_execution(before: dict, after: dict) -> dict:
    """Triton's compute stages per execution (batch_stats), whatever the batch sizes were."""
    def sums(stats: dict) -> dict[str, tuple[int, int]]:
        out = {s: (0, 0) for s in STAGES}
        for b in stats.get("batch_stats", []):
            for s in STAGES:
                c, ns = out[s]
                out[s] = (c + int(b[s]["count"]), ns + int(b[s]["ns"]))
        return out

    a, b = sums(before), sums(after)
    executions = b["compute_infer"][0] - a["compute_infer"][0]
    return {"executions": executions,
            **{f"{s}_ms": (b[s][1] - a[s][1]) / executions / 1e6 if executions else None for s in STAGES}}


def served(url: str, model: str, timings_dir: Path, clients: int, seconds: float) -> dict:
    """Closed loop of `clients` gRPC clients, one sample a request; Triton's and the runner's side."""
    load = Load(concurrency=clients, duration_s=seconds, warmup_s=1.0)
    t_before = runner_timings.read(timings_dir, f"{model}_")
    out = asyncio.run(run_load(url, model, load, [RequestClass()]))
    t = runner_timings.delta(t_before, runner_timings.read(timings_dir, f"{model}_"))
    result = build_result(model, load, [RequestClass()], out)
    ex = _per_execution(out.stats_before, out.stats_after)
    execs = ex["executions"] or 1
    runner = {"execute_ms": t["execute_ns"] / t["executes"] / 1e6 if t["executes"] else None,
              "ort_ms": t["ort_ns"] / t["executes"] / 1e6 if t["executes"] else None,
              "ort_calls_per_execute": t["ort_calls"] / t["executes"] if t["executes"] else None}
    o, s = result["overall"], result["server"]
    return {"clients": clients, "rps": o["throughput_rps"], "ok": o["ok"], "errors": o["errors"],
            "p50_ms": o["p50_ms"], "mean_ms": o["mean_ms"], "mean_batch": s.get("mean_batch"),
            "cycle_ms": 1e3 * seconds / execs, "queue_ms": s.get("queue_ms"), "request_ms": s.get("request_ms"),
            **ex, "runner": runner, "generator": result["generator"]}


def run_serving_bench(out_dir: Path, *, max_batch: int = 16, threads: int = 1, instances: int = 1,
                      seconds: float = 5.0, width: int = 2048, layers: int = 4,
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
    rows = []
    os.environ[runner_timings.ENV] = str(timings_dir)  # the server and its stubs inherit it
    try:
        with running(spec, out_dir / "repo", out_dir / "state", log=log) as r:
            url = r.endpoints.grpc
            for b in batches:
                clients = 2 * b * instances  # a full batch executing on each instance and the next one queued
                log(f"== batch {b}: raw ONNX Runtime, then served ({clients} clients), {seconds:g} s each")
                raw = raw_ort(sessions, feed, width, b, seconds)
                srv = served(url, model_name(b), timings_dir, clients, seconds)
                rows.append({"batch": b, "raw": raw, "served": srv, "served_over_raw": srv["rps"] / raw["rps"]})
                log(f"   raw {raw['rps']:.0f} req/s, served {srv['rps']:.0f} req/s "
                    f"(mean batch {srv['mean_batch'] or 0:.1f}): {srv['rps'] / raw['rps']:.2f}")
            log(f"== light load: one client, batch 1, {seconds:g} s each")
            raw1 = raw_ort(sessions[:1], feed, width, 1, seconds)
            light = served(url, model_name(max_batch), timings_dir, 1, seconds)
    finally:
        os.environ.pop(runner_timings.ENV, None)
    latency = {"raw_p50_ms": raw1["p50_ms"], "served_p50_ms": light["p50_ms"],
               "raw_mean_ms": raw1["mean_ms"], "served_mean_ms": light["mean_ms"],
               "added_p50_ms": light["p50_ms"] - raw1["p50_ms"], "added_mean_ms": light["mean_ms"] - raw1["mean_ms"],
               "served": light}
    bench = {"schema": SCHEMA, "kind": "bench/serving", "model": {"width": width, "layers": layers},
             "threads": threads, "instances": instances, "cores": os.cpu_count(), "seconds": seconds,
             "rows": rows, "light_load": latency, "targets": TARGETS}
    write_bytes_atomic(out_dir / "bench_serving.json", json.dumps(bench, indent=2, default=str).encode())
    log(format_serving_bench(bench))
    return bench


def _ms(v: float | None) -> str:
    return f"{v:.2f}" if v is not None else "-"


def format_serving_bench(bench: dict) -> str:
    lines = [f"sample model, {bench['instances']} instance(s) x {bench['threads']} ORT thread(s), "
             f"{bench['cores']} cores, {bench['seconds']:g} s per run",
             f"{'batch':>5} {'raw req/s':>10} {'served':>8} {'ratio':>6} {'m.batch':>7} | per execution, ms: "
             f"{'raw':>5} {'cycle':>6} {'input':>6} {'infer':>6} {'execute':>7} {'ORT':>6} {'output':>6}"]
    for row in bench["rows"]:
        r, s = row["raw"], row["served"]
        lines.append(f"{row['batch']:>5} {r['rps']:>10.0f} {s['rps']:>8.0f} {row['served_over_raw']:>6.2f} "
                     f"{s['mean_batch'] or 0:>7.1f} | {'':>19}{_ms(r['mean_ms']):>5} {_ms(s['cycle_ms']):>6} "
                     f"{_ms(s['compute_input_ms']):>6} {_ms(s['compute_infer_ms']):>6} "
                     f"{_ms(s['runner']['execute_ms']):>7} {_ms(s['runner']['ort_ms']):>6} "
                     f"{_ms(s['compute_output_ms']):>6}")
    lat = bench["light_load"]
    lines.append(f"batch 1, one client: raw P50 {lat['raw_p50_ms']:.2f} ms, served P50 {lat['served_p50_ms']:.2f} ms: "
                 f"added {lat['added_p50_ms']:.2f} ms (mean: added {lat['added_mean_ms']:.2f} ms)")
    top = bench["rows"][-1]
    t = bench["targets"]
    lines.append(f"served/raw at max batch {top['batch']}: {top['served_over_raw']:.2f} "
                 f"(target >= {t['served_over_raw_at_max_batch_at_least']}); added latency at batch 1: "
                 f"{lat['added_p50_ms']:.2f} ms (target <= {t['added_latency_batch1_ms_at_most']} ms)")
    return "\n".join(lines)
