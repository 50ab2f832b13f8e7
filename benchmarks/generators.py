"""`tritonkit bench generators` (`make bench`): what the load generators can do and what they add.

Three figures, each measured in this one run and printed as ratios, never asserted as times:

- Capacity: completed requests per second of generator CPU (req/s per core), closed loop, for
  Locust with tritonclient HTTP users and for the asyncio gRPC generator. Dividing by the
  generator's own CPU time keeps the figure meaningful when the server shares the machine.
- Distortion: at a moderate open-loop rate, the client's P95 minus the server's P95 (Triton's
  summary quantile) and the client's mean minus the server's mean request time: what the
  generator and the network add to what users would be told.

- Agreement: the same load (the sample model with the default spec's batching, Poisson at
  AGREEMENT_RATE for AGREEMENT_S) through all three engines, perf_analyzer included, rounds
  interleaved so that a slow minute of the machine hits each engine: per engine the served rate,
  P50/P95/P99, Triton's queue and compute per request, and the generator's own CPU; and each
  engine's P95 over perf_analyzer's, round by round.

Capacity and distortion give each engine its own copy of a small model, so that Triton's summary
quantiles of one run do not mix with another's (perf_analyzer, which sends one class from C++, is
measured by the agreement figure).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

import yaml

from tritonkit import sample_model
from tritonkit.configs.generate import generate
from tritonkit.configs.loader import load_spec
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.load import Load
from tritonkit.loadtests.measure import measure_by
from tritonkit.loadtests.results import SCHEMA, write_result
from tritonkit.serving import running

ENGINES = ("locust", "asyncio")
ALL_ENGINES = ("locust", "asyncio", "perf_analyzer")
AGREEMENT_RATE = 300.0
AGREEMENT_S = 10.0
AGREEMENT_ROUNDS = 3
# the default spec's batching for the sample model, so the agreement load is the one users meet first
SAMPLE_BATCHING = {"preferred_batch_sizes": [4, 8], "max_queue_delay_us": 2000}


def bench_spec(folder: Path) -> Path:
    """A cheap model (so the server is rarely the limit), one copy per engine, on free ports."""
    onnx = sample_model.write(folder / "bench_mlp.onnx", width=128, layers=2).resolve()
    models = [{"name": f"bench_{e}", "onnx": str(onnx), "max_batch_size": 16,
               "batching": {"max_queue_delay_us": 500}} for e in ENGINES]
    sample = sample_model.write(folder / "edge_mlp.onnx").resolve()
    models.append({"name": "bench_sample", "onnx": str(sample), "max_batch_size": 16, "instances": {"count": 2},
                   "batching": SAMPLE_BATCHING})
    path = folder / "deploy.yaml"
    path.write_text(yaml.safe_dump({"models": models,
                                    "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0}}))
    return path


def run_bench(out_dir: Path, *, seconds: float = 5.0, users: int = 16, rate: float = 200.0,
              rounds: int = AGREEMENT_ROUNDS, log: Callable[[str], None] = print) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec_path = bench_spec(out_dir)
    repo = out_dir / "repo"
    spec = load_spec(spec_path, repo)  # the bench's own spec, written just above
    generate(spec, repo)
    figures: dict[str, dict] = {}
    with running(spec, repo, out_dir / "state", log=log) as r:
        e = r.endpoints
        for engine in ENGINES:
            model = spec.model(f"bench_{engine}")
            url = e.http if engine == "locust" else e.grpc
            log(f"== {engine}: capacity, closed loop, {users} clients, {seconds:g} s")
            cap = measure_by(engine, model.name, Load(concurrency=users, duration_s=seconds, warmup_s=1), None,
                             url=url, metrics=e.metrics, log_dir=out_dir / engine / "capacity")
            write_result(cap, out_dir / engine / "capacity")
            log(f"== {engine}: distortion, open loop, {rate:g} req/s, {seconds:g} s")
            dist = measure_by(engine, model.name, Load(rate=rate, duration_s=seconds, warmup_s=1), None,
                              url=url, metrics=e.metrics, log_dir=out_dir / engine / "distortion")
            write_result(dist, out_dir / engine / "distortion")
            figures[engine] = _figures(cap, dist)
        agreed = agreement(e, out_dir / "agreement", rounds=rounds, log=log)
    bench = {"schema": SCHEMA, "kind": "bench/generators", "figures": figures, "agreement": agreed,
             "ratios": {"capacity_asyncio_over_locust": _ratio(figures["asyncio"]["req_per_core_s"],
                                                               figures["locust"]["req_per_core_s"])}}
    write_bytes_atomic(out_dir / "bench.json", json.dumps(bench, indent=2).encode())
    log(format_bench(bench))
    return bench


def agreement(e, out_dir: Path, *, rounds: int, rate: float = AGREEMENT_RATE, seconds: float = AGREEMENT_S,
              log: Callable[[str], None] = print) -> dict:
    """The same open-loop load through every engine, `rounds` times, engines interleaved."""
    rows: dict[str, list[dict]] = {engine: [] for engine in ALL_ENGINES}
    for i in range(rounds):
        for engine in ALL_ENGINES:
            log(f"== agreement round {i + 1}/{rounds}, {engine}: Poisson {rate:g} req/s, {seconds:g} s")
            url = e.http if engine == "locust" else e.grpc
            r = measure_by(engine, "bench_sample", Load(rate=rate, duration_s=seconds, warmup_s=2), None, url=url,
                           metrics=e.metrics, log_dir=out_dir / engine / str(i))
            write_result(r, out_dir / engine / str(i))
            o, srv = r["overall"], r["server"]
            rows[engine].append({
                "rps": round(o["throughput_rps"], 1), "errors": sum(o["errors"].values()),
                **{k: round(o[k], 3) for k in ("p50_ms", "p95_ms", "p99_ms")},
                "queue_ms": _round(srv.get("queue_ms")),
                "compute_ms": _round(sum(srv.get(f"{s}_ms") or 0 for s in ("compute_input", "compute_infer",
                                                                          "compute_output"))),
                "generator_cpu_pct": r["generator"]["cpu_percent"], "saturated": r["generator"]["saturated"]})
    base = rows["perf_analyzer"]
    return {"rate": rate, "seconds": seconds, "rounds": rows,
            "median": {engine: {k: statistics.median(x[k] for x in rs) for k in rs[0] if k != "saturated"}
                       for engine, rs in rows.items()},
            "p95_over_perf_analyzer": {engine: [round(x["p95_ms"] / b["p95_ms"], 3) for x, b in zip(rs, base)]
                                       for engine, rs in rows.items() if engine != "perf_analyzer"}}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _figures(cap: dict, dist: dict) -> dict:
    gen = cap["generator"]
    cpu = gen["cpu_percent"] / 100.0
    server_p95_ms = dist["server_summary_us"].get("request", {}).get("0.95", float("nan")) / 1e3
    return {
        "req_s": gen["achieved_rate"],
        "cpu_cores": round(cpu, 3),
        "req_per_core_s": round(gen["achieved_rate"] / cpu, 1) if cpu > 0 else None,
        "client_p95_ms": round(dist["overall"]["p95_ms"], 3),
        "server_p95_ms": round(server_p95_ms, 3),
        "p95_distortion_ms": round(dist["overall"]["p95_ms"] - server_p95_ms, 3),
        "mean_overhead_ms": round(dist["client_overhead_ms"], 3) if dist["client_overhead_ms"] is not None else None,
        "distortion_saturated": dist["generator"]["saturated"],
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def format_bench(bench: dict) -> str:
    f = bench["figures"]
    rows = [("", "locust (HTTP)", "asyncio (gRPC)"),
            ("capacity, req/s per generator core", *(str(f[e]["req_per_core_s"]) for e in ENGINES)),
            ("  (req/s reached, cores used)", *(f"{f[e]['req_s']:g}, {f[e]['cpu_cores']:g}" for e in ENGINES)),
            ("distortion: client P95 - server P95, ms", *(f"{f[e]['p95_distortion_ms']:+.2f}" for e in ENGINES)),
            ("  (client P95, server P95, ms)",
             *(f"{f[e]['client_p95_ms']:.2f}, {f[e]['server_p95_ms']:.2f}" for e in ENGINES)),
            ("distortion: client mean - server mean, ms", *(f"{f[e]['mean_overhead_ms']:+.2f}" for e in ENGINES))]
    width = max(len(r[0]) for r in rows) + 2
    lines = [f"{r[0]:<{width}}{r[1]:>20}{r[2]:>20}" for r in rows]
    ratio = bench["ratios"]["capacity_asyncio_over_locust"]
    lines.append(f"capacity ratio asyncio gRPC / Locust HTTP: {ratio}x")
    a = bench["agreement"]
    lines.append(f"agreement: Poisson {a['rate']:g} req/s for {a['seconds']:g} s, {len(a['rounds']['asyncio'])} rounds "
                 f"(medians; Triton's queue and compute per request)")
    lines.append(f"{'engine':<16}{'req/s':>8}{'P50 ms':>8}{'P95 ms':>8}{'P99 ms':>8}{'queue':>8}{'compute':>9}"
                 f"{'gen CPU%':>10}   P95 / perf_analyzer's, per round")
    for engine, m in a["median"].items():
        ratios = ", ".join(f"{x:.2f}" for x in a["p95_over_perf_analyzer"].get(engine, [])) or "-"
        lines.append(f"{engine:<16}{m['rps']:>8.1f}{m['p50_ms']:>8.2f}{m['p95_ms']:>8.2f}{m['p99_ms']:>8.2f}"
                     f"{m['queue_ms'] or 0:>8.2f}{m['compute_ms'] or 0:>9.2f}{m['generator_cpu_pct']:>10.1f}"
                     f"   {ratios}")
    return "\n".join(lines)
