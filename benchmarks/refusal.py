"""`tritonkit bench refusal`: how fast a refusal can be on this machine, and what slows it.

The overload bench's refusal P95 is a whole round trip: the kit's client builds the request and
sends it, Envoy's breaker refuses it, the refusal comes back. Here nothing else happens: an Envoy
in front of the model whose bulk threshold admits nothing refuses every request (metadata and
statistics ride its control route), so each request's time is the client's and the gateway's
alone, with the model's own request size. Three conditions, on the server's cores as in a pod:

- alone: Envoy's core otherwise idle;
- beside a busy neighbour: a process that keeps the server's cores busy, as Triton does under
  overload, in a CPU cgroup of its own weighted as the chart weights Triton's container against
  the gateway's (`benchmarks/pod_cpu.py`);
- the same at equal weights: the gateway's cgroup weighted as Triton's.

Where this machine lets no cgroup be made, the neighbour shares this process's cgroup and the
third condition is left out. The generator runs on the other cores, at one Poisson rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tritonkit.benchmarks.cores import pinned, split_cores
from tritonkit.benchmarks.overload import sidecar_gateways
from tritonkit.benchmarks.pod_cpu import chart_requests, in_container, pod_cpu
from tritonkit.configs.gateway import GatewayLimits
from tritonkit.configs.generate import generate
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.asyncgen import run_load
from tritonkit.loadtests.load import Load, RequestClass
from tritonkit.loadtests.results import SCHEMA
from tritonkit.serving import running
from tritonkit.spec import Spec
from tritonkit.stats import medians, percentile

CONDITIONS = ("alone", "busy neighbour", "busy neighbour, equal weights")
REFUSE_ALL = GatewayLimits(max_requests=0, max_requests_high=1_000, timeout_ms=None)  # bulk: none admitted
BULK = [RequestClass("bulk")]


@contextlib.contextmanager
def _neighbour(cpus: set[int] | None, pod):
    """A busy loop on each of `cpus` (in Triton's cgroup of the pod, if there is one)."""
    procs = []
    try:
        for cpu in sorted(cpus or {0}):
            with pinned({cpu} if cpus else None), in_container(pod, "triton"):
                procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


async def _refusals(url: str, model: str, rate: float, seconds: float, seed: int) -> list[float]:
    """Each refused request's time, in ms."""
    out = await run_load(url, model, Load(rate=rate, duration_s=seconds, warmup_s=1.0, drain_s=2.0), BULK, seed=seed)
    return [s.failed_after_s * 1e3 for s in out.samples if s.failed_after_s is not None and s.kind == "refused"]


def run_refusal_bench(spec: Spec, model: str, repo: Path, state_dir: Path, out_dir: Path, *, rate: float = 300.0,
                      seconds: float = 4.0, runs: int = 3, log: Callable[[str], None] = print) -> dict:
    generate(spec, repo)
    server_cpus, generator_cpus = split_cores()
    requests = chart_requests()
    result = {"schema": SCHEMA, "kind": "bench/refusal", "model": model, "rate": rate, "seconds": seconds,
              "runs": runs, "requests": requests, "server_cpus": sorted(server_cpus or []),
              "generator_cpus": sorted(generator_cpus or []), "conditions": {}}
    folder = Path(state_dir) / "refusal"
    folder.mkdir(parents=True, exist_ok=True)
    ports = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
    with running(spec, repo, state_dir, models=[model], ports=ports, log=log, cpus=server_cpus) as r:
        for condition in CONDITIONS:
            weights = {**requests, "gateway": requests["triton"]} if "equal" in condition else requests
            with contextlib.ExitStack() as stack:
                pod = stack.enter_context(pod_cpu(weights, "tritonkit-refusal"))
                if pod is None and "equal" in condition:
                    log(f"  {condition}: left out (no CPU cgroup can be made here)")
                    continue
                gw = stack.enter_context(sidecar_gateways(r.endpoints.grpc_port, {"refuse": REFUSE_ALL}, folder,
                                                          server_cpus, pod))
                if condition != "alone":
                    stack.enter_context(_neighbour(server_cpus, pod))
                stack.enter_context(pinned(generator_cpus))
                per_run = []
                for run in range(runs):
                    ms = asyncio.run(_refusals(gw["refuse"][0], model, rate, seconds, seed=run))
                    per_run.append({"refused": len(ms), "p50_ms": round(percentile(ms, 50), 2) if ms else None,
                                    "p95_ms": round(percentile(ms, 95), 2) if ms else None})
                    log(f"  {condition}, run {run + 1}: {len(ms)} refused, P50 {per_run[-1]['p50_ms']} ms, "
                        f"P95 {per_run[-1]['p95_ms']} ms")
                result["conditions"][condition] = {"cgroups": pod.describe() if pod else "one flat cgroup",
                                                   "runs": per_run, **medians(per_run, ("p50_ms", "p95_ms"))}
    for line in format_refusal_bench(result):
        log(line)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out_dir / "bench_refusal.json", json.dumps(result, indent=2).encode())
    return result


def format_refusal_bench(result: dict) -> list[str]:
    lines = [f"a refusal's time for {result['model']} at {result['rate']:g} req/s, {result['runs']} runs "
             f"(median, min-max): Envoy refusing every bulk request"]
    for condition, c in result["conditions"].items():
        cells = [f"{k[:3].upper()} {c[k]['median']:.2f} ({c[k]['min']:.2f}-{c[k]['max']:.2f}) ms" if c[k] else "-"
                 for k in ("p50_ms", "p95_ms")]
        lines.append(f"  {condition:<32} {cells[0]:<26} {cells[1]:<26} {c['cgroups']}")
    return lines
