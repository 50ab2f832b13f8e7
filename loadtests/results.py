"""The one result schema (JSON, with CSV export) for load tests, sweep rows and benchmarks."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from dataclasses import asdict
from pathlib import Path

from tritonkit.clients import Client
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.asyncgen import Load, Outcome, RequestClass, generator_health, run_load
from tritonkit.loadtests.server_stats import breakdown, summary_quantiles
from tritonkit.stats import summary_ms

SCHEMA = "tritonkit.result/1"


def class_summary(samples, duration_s: float) -> dict:
    ok = [s.latency_s for s in samples if s.latency_s is not None]
    errors: dict[str, int] = {}
    for s in samples:
        if s.kind:
            errors[s.kind] = errors.get(s.kind, 0) + 1
    return {"requests": len(samples), "ok": len(ok), "errors": errors,
            "throughput_rps": len(ok) / duration_s, **summary_ms(ok)}


def build_result(model: str, load: Load, classes: list[RequestClass], out: Outcome, server: dict,
                 quantiles: dict | None = None) -> dict:
    per_class = {c.name: class_summary([s for s in out.samples if s.cls == c.name], load.duration_s)
                 for c in classes}
    overall = class_summary(out.samples, load.duration_s)
    client_overhead = (overall["mean_ms"] - server["request_ms"]) if server.get("request_ms") else None
    return {
        "schema": SCHEMA,
        "model": model,
        "load": {**asdict(load), "mode": load.mode, "description": load.describe()},
        "classes": per_class,
        "overall": overall,
        "server": server,
        "server_summary_us": quantiles or {},
        # What the client saw minus what Triton measured: network, (de)serialisation, client.
        "client_overhead_ms": client_overhead,
        "generator": generator_health(load, out),
        "error_examples": out.error_examples,
    }


def measure(endpoints, model: str, load: Load, classes: list[RequestClass] | None = None, *,
            seed: int = 0) -> dict:
    """One measurement against a running server: statistics before, load, statistics after."""
    classes = classes or [RequestClass()]
    with Client(endpoints.grpc, "grpc") as c:
        before = c.statistics(model)
        out = asyncio.run(run_load(endpoints.grpc, model, load, classes, seed=seed))
        after = c.statistics(model)
    try:
        quantiles = summary_quantiles(endpoints.metrics, model)
    except OSError:
        quantiles = {}
    return build_result(model, load, classes, out, breakdown(before, after), quantiles)


def csv_rows(result: dict) -> list[dict]:
    rows = []
    for name, s in [*result["classes"].items(), ("overall", result["overall"])]:
        rows.append({"class": name, "requests": s["requests"], "ok": s["ok"],
                     "errors": sum(s["errors"].values()), "errors_json": json.dumps(s["errors"]),
                     "throughput_rps": round(s["throughput_rps"], 2),
                     **{k: round(s[k], 3) for k in ("mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "max_ms")}})
    return rows


def write_result(result: dict, out_dir: Path) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    js = out_dir / "result.json"
    write_bytes_atomic(js, json.dumps(result, indent=2, default=str).encode())
    rows = csv_rows(result)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    cs = out_dir / "result.csv"
    write_bytes_atomic(cs, buf.getvalue().encode())
    return js, cs


def format_result(result: dict) -> str:
    lines = [f"{result['model']}: {result['load']['description']}, {result['load']['duration_s']:g} s steady"]
    lines.append(f"{'class':<14}{'requests':>9}{'ok':>8}{'errors':>30}{'req/s':>9}"
                 f"{'P50 ms':>9}{'P95 ms':>9}{'P99 ms':>9}")
    for name, s in [*result["classes"].items(), ("overall", result["overall"])]:
        errs = ",".join(f"{k}={v}" for k, v in s["errors"].items()) or "-"
        lines.append(f"{name:<14}{s['requests']:>9}{s['ok']:>8}{errs:>30}{s['throughput_rps']:>9.1f}"
                     f"{s['p50_ms']:>9.2f}{s['p95_ms']:>9.2f}{s['p99_ms']:>9.2f}")
    srv = result["server"]
    if srv.get("request_ms") is not None:
        lines.append(f"server per request: queue {srv['queue_ms']:.2f} ms, input {srv['compute_input_ms']:.2f} ms, "
                     f"infer {srv['compute_infer_ms']:.2f} ms, output {srv['compute_output_ms']:.2f} ms; "
                     f"mean batch {srv['mean_batch']:.1f}; client overhead {result['client_overhead_ms']:.2f} ms")
    if result["generator"]["warning"]:
        lines.append("WARNING: " + result["generator"]["warning"])
    return "\n".join(lines)
