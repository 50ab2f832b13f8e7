"""The one result schema (JSON, with CSV export) for load tests, sweep rows and benchmarks.

Pure data: the Locust process imports it too. Measuring lives in `loadtests.measure`."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict
from pathlib import Path

from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.load import Load, Outcome, RequestClass, generator_health
from tritonkit.loadtests.server_stats import breakdown
from tritonkit.stats import percentile, summary_ms

SCHEMA = "tritonkit.result/1"


def class_summary(samples, duration_s: float) -> dict:
    ok = [s.latency_s for s in samples if s.latency_s is not None]
    errors: dict[str, int] = {}
    for s in samples:
        if s.kind:
            errors[s.kind] = errors.get(s.kind, 0) + 1
    failed = [s.failed_after_s for s in samples if s.failed_after_s is not None]
    # How fast a refusal comes back: a bounded queue should answer "full" at once, not at a timeout.
    return {"requests": len(samples), "ok": len(ok), "errors": errors,
            "throughput_rps": len(ok) / duration_s, **summary_ms(ok),
            "failed_p95_ms": percentile(failed, 95) * 1e3 if failed else None}


def build_result(model: str, load: Load, classes: list[RequestClass], out: Outcome,
                 quantiles: dict | None = None, engine: str = "asyncio") -> dict:
    have_stats = out.stats_before is not None and out.stats_after is not None
    server = breakdown(out.stats_before, out.stats_after) if have_stats else {}
    per_class = {c.name: class_summary([s for s in out.samples if s.cls == c.name], load.duration_s)
                 for c in classes}
    overall = class_summary(out.samples, load.duration_s)
    client_overhead = (overall["mean_ms"] - server["request_ms"]) if server.get("request_ms") else None
    return {
        "schema": SCHEMA,
        "model": model,
        "engine": engine,
        "load": {**asdict(load), "mode": load.mode, "description": load.describe()},
        "classes": per_class,
        "overall": overall,
        "server": server,
        "server_summary_us": quantiles or {},
        # What the client saw minus what Triton measured: network, (de)serialisation, client.
        "client_overhead_ms": client_overhead,
        "padding_waste": out.padding_waste,
        "generator": generator_health(load, out),
        "timeline": timeline(out, load),
        "error_examples": out.error_examples,
    }


def timeline(out: Outcome, load: Load, step_s: float = 1.0) -> list[dict]:
    """Per-second buckets of the steady window (by scheduled time): what was sent, served and its P95."""
    if not out.samples:
        return []
    t0 = min(s.scheduled for s in out.samples)  # within one lag of the window's start
    n = max(1, math.ceil(load.duration_s / step_s))
    buckets: list[list] = [[] for _ in range(n)]
    for s in out.samples:
        buckets[min(n - 1, int((s.scheduled - t0) / step_s))].append(s)
    rows = []
    for i, b in enumerate(buckets):
        ok = [s.latency_s for s in b if s.latency_s is not None]
        rows.append({"t_s": round(i * step_s, 3), "sent": len(b), "ok": len(ok),
                     "p95_ms": round(percentile(ok, 95) * 1e3, 3) if ok else None})
    return rows


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


def _ms(v: float | None) -> str:
    """A latency for the console: '-' where no request succeeded (never 'nan')."""
    return "-" if v is None or v != v else f"{v:.2f}"


def error_share(result: dict) -> float:
    o = result["overall"]
    return sum(o["errors"].values()) / o["requests"] if o["requests"] else 1.0


def format_result(result: dict) -> str:
    lines = [f"{result['model']}: {result['load']['description']}, {result['load']['duration_s']:g} s steady"]
    lines.append(f"{'class':<14}{'requests':>9}{'ok':>8}{'errors':>30}{'req/s':>9}"
                 f"{'P50 ms':>9}{'P95 ms':>9}{'P99 ms':>9}")
    for name, s in [*result["classes"].items(), ("overall", result["overall"])]:
        errs = ",".join(f"{k}={v}" for k, v in s["errors"].items()) or "-"
        lines.append(f"{name:<14}{s['requests']:>9}{s['ok']:>8}{errs:>30}{s['throughput_rps']:>9.1f}"
                     f"{_ms(s['p50_ms']):>9}{_ms(s['p95_ms']):>9}{_ms(s['p99_ms']):>9}")
    for kind, example in (result.get("error_examples") or {}).items():
        lines.append(f"error {kind}: e.g. {example}")
    srv = result["server"]
    if srv.get("request_ms") is not None:
        lines.append(f"server per request: queue {srv['queue_ms']:.2f} ms, input {srv['compute_input_ms']:.2f} ms, "
                     f"infer {srv['compute_infer_ms']:.2f} ms, output {srv['compute_output_ms']:.2f} ms; "
                     f"mean batch {srv['mean_batch']:.1f}; client overhead {_ms(result['client_overhead_ms'])} ms")
    if result.get("steps"):
        lines.append("per step (Triton's statistics over the whole run, warm-up included):")
        lines.append(f"  {'model':<24}{'requests':>9}{'queue ms':>10}{'compute ms':>12}{'mean batch':>12}")
        for s in result["steps"]:
            lines.append(f"  {s['model']:<24}{s['requests']:>9}{_ms(s['queue_ms']):>10}{_ms(s['compute_ms']):>12}"
                         f"{'-' if s['mean_batch'] is None else format(s['mean_batch'], '.1f'):>12}")
    if result.get("router"):
        lines.extend(format_router(result["router"]))
    if result["generator"]["warning"]:
        lines.append("WARNING: " + result["generator"]["warning"])
    return "\n".join(lines)


def format_router(section: dict) -> list[str]:
    co = section["coalesce"]
    coalesced = f"coalesced {co['hits']} of {co['requests']} ({co['hit_rate']:.1%})" if co["enabled"] else \
        "coalescing off"
    inferences = section["triton_inferences"]
    failed = ",".join(f"{k}={v}" for k, v in section["errors"].items())
    lines = [f"router: {len(section['endpoints'])} endpoint(s), {section['ok']} of {section['requests']} requests "
             f"answered{f' (failed: {failed})' if failed else ''}; retries {section['retries']}, "
             f"hedges {section['hedges']}; {coalesced}; "
             f"Triton inferences {'-' if inferences is None else inferences}",
             f"{'endpoint':<22}{'role':<8}{'share':>7}{'sent':>7}{'ok':>7}{'failed':>7}{'retry-to':>9}{'hedged':>7}"
             f"{'explored':>9}"
             f"{'P50 ms':>8}{'P95 ms':>8}{'RTT ms':>8}{'breaker':>10}{'inferred':>9}{'cache':>7}"]
    for url, e in section["endpoints"].items():
        lines.append(f"{url:<22}{e['role']:<8}{e['share']:>7.1%}{e['sent']:>7}{e['ok']:>7}{e['failed']:>7}"
                     f"{e['retried_to']:>9}{e['hedged']:>7}{e['explored']:>9}{_cell(e['p50_ms'])}{_cell(e['p95_ms'])}"
                     f"{_cell(e['rtt_ms'])}{e['breaker']:>10}{_cell(e['triton_inferences'], 9, 'd')}"
                     f"{_cell(e['cache_hits'], 7, 'd')}")
    return lines


def _cell(v, width: int = 8, fmt: str = ".2f") -> str:
    return f"{'-':>{width}}" if v is None else f"{v:>{width}{fmt}}"
