"""`tritonkit bench generators` (`make bench`): what the two load generators can do and what they add.

Two figures, each measured in this one run and printed as ratios, never asserted as times:

- Capacity: completed requests per second of generator CPU (req/s per core), closed loop, for
  Locust with tritonclient HTTP users and for the asyncio gRPC generator. Dividing by the
  generator's own CPU time keeps the figure meaningful when the server shares the machine.
- Distortion: at a moderate open-loop rate, the client's P95 minus the server's P95 (Triton's
  summary quantile) and the client's mean minus the server's mean request time: what the
  generator and the network add to what users would be told.

Each engine gets its own copy of a small model, so that Triton's summary quantiles of one run
do not mix with the other's.
"""

from __future__ import annotations

import json
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


def bench_spec(folder: Path) -> Path:
    """A cheap model (so the server is rarely the limit), one copy per engine, on free ports."""
    onnx = sample_model.write(folder / "bench_mlp.onnx", width=128, layers=2).resolve()
    models = [{"name": f"bench_{e}", "onnx": str(onnx), "max_batch_size": 16,
               "batching": {"max_queue_delay_us": 500}} for e in ENGINES]
    path = folder / "deploy.yaml"
    path.write_text(yaml.safe_dump({"models": models,
                                    "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0}}))
    return path


def run_bench(out_dir: Path, *, seconds: float = 5.0, users: int = 16, rate: float = 200.0,
              log: Callable[[str], None] = print) -> dict:
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
    bench = {"schema": SCHEMA, "kind": "bench/generators", "figures": figures,
             "ratios": {"capacity_asyncio_over_locust": _ratio(figures["asyncio"]["req_per_core_s"],
                                                               figures["locust"]["req_per_core_s"])}}
    write_bytes_atomic(out_dir / "bench.json", json.dumps(bench, indent=2).encode())
    log(format_bench(bench))
    return bench


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
    return "\n".join(lines)
