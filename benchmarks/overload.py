"""`tritonkit bench overload` (`make bench`): what a config does when more load arrives than the
server can take, for the spec's config as written and the tuned one (tuned.yaml), side by side.

Per config: its capacity is measured first on a copy without queue policy or priority levels
(Triton's prefetch on, the most the batch size and instances can serve), closed loop. Then
open-loop Poisson load at 0.8x, 1.5x and 3x that capacity, a quarter interactive (priority 1)
and the rest bulk (the default priority). Reported, each measured in this run:
- goodput ratio: requests answered within the SLO per second, over the capacity;
- P95 per class of the answered requests;
- how fast a refusal comes back (P95 of a failed request's latency): a bounded queue says
  "full" at once; a stalled batcher or a timeout takes its time;
- whether the load generator, not the server, limited the run (the row says so rather than
  passing off its figure).

Overload is the server's to handle, not the machine's: on a box of a few cores, a generator
offering 3x competes with the server for the same cores and the figures measure that contest.
So the server (and its backend stubs) run on half the cores and the generator on the other half,
as clients on other machines would; the result names both sets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from tritonkit.configs.generate import generate
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.asyncgen import run_load
from tritonkit.loadtests.load import Load, Outcome, RequestClass, generator_health
from tritonkit.loadtests.results import SCHEMA, class_summary
from tritonkit.serving import running
from tritonkit.spec import Spec

FACTORS = (0.8, 1.5, 3.0)
CLASSES = [RequestClass("interactive", weight=1, priority=1), RequestClass("bulk", weight=3, priority=0)]


def _renamed(spec: Spec, model: str, name: str, free: bool = False):
    """The model under another name; `free`: without queue policies or priority levels."""
    m = spec.model(model).model_copy(update={"name": name})
    if free:
        b = m.batching.model_copy(update={"priority_levels": 0, "default_priority": 0, "default_queue_policy": None,
                                          "priority_queue_policies": {}})
        m = m.model_copy(update={"batching": b})
    return m


def summarize(out: Outcome, load: Load, capacity: float, slo_ms: float) -> dict:
    """One row: the result schema's class summaries (loadtests/results.py), plus goodput within the SLO."""
    def p95(summary: dict) -> float | None:
        return None if summary["p95_ms"] != summary["p95_ms"] else summary["p95_ms"]  # NaN: none answered

    overall = class_summary(out.samples, load.duration_s)
    rows = {}
    for c in CLASSES:
        cs = class_summary([s for s in out.samples if s.cls == c.name], load.duration_s)
        rows[c.name] = {"requests": cs["requests"], "ok": cs["ok"], "p95_ms": p95(cs)}
    within = sum(1 for s in out.samples if s.latency_s is not None and s.latency_s * 1e3 <= slo_ms) / load.duration_s
    health = generator_health(load, out)
    return {"offered_rps": load.rate, "goodput_rps": round(within, 1),
            "goodput_ratio": round(within / capacity, 3) if capacity else None,
            "classes": rows, "errors": overall["errors"], "rejection_p95_ms": overall["failed_p95_ms"],
            "generator_limited": bool(health["warning"]), "generator_warning": health["warning"]}


async def _bench_config(url: str, name: str, free_name: str, slo_ms: float, seconds: float,
                        log: Callable[[str], None]) -> dict:
    cap_load = Load(concurrency=32, duration_s=seconds, warmup_s=1.0, drain_s=3.0)
    cap_out = await run_load(url, free_name, cap_load)
    capacity = sum(1 for s in cap_out.samples if s.latency_s is not None) / cap_load.duration_s
    log(f"  capacity (no queue policy, closed loop of 32): {capacity:.0f} req/s")
    rows = []
    for f in FACTORS:
        load = Load(rate=f * capacity, duration_s=seconds, warmup_s=1.0, drain_s=3.0)
        row = {"factor": f, **summarize(await run_load(url, name, load, CLASSES), load, capacity, slo_ms)}
        rows.append(row)
        log("  " + format_row(row))
    return {"capacity_rps": round(capacity, 1), "rows": rows}


def _ms(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def format_row(r: dict) -> str:
    c = r["classes"]
    return (f"{r['factor']:>4g}x {r['offered_rps']:>7.0f}/s  goodput {r['goodput_ratio']:.2f}  "
            f"P95 interactive {_ms(c['interactive']['p95_ms']):>6} ms  bulk {_ms(c['bulk']['p95_ms']):>6} ms  "
            f"rejection P95 {_ms(r['rejection_p95_ms']):>6} ms  errors {r['errors'] or '-'}"
            f"{'  (generator-limited)' if r['generator_limited'] else ''}")


def split_cores() -> tuple[set[int] | None, set[int] | None]:
    """(server cores, generator cores): halves of what this process may use; None on one core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None, None
    half = len(cores) // 2
    return set(cores[:half]), set(cores[half:])


@contextlib.contextmanager
def _pinned(cpus: set[int] | None):
    before = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def run_overload_bench(configs: dict[str, Spec], model: str, repo: Path, state_dir: Path, out_dir: Path, *,
                       seconds: float = 4.0, log: Callable[[str], None] = print) -> dict:
    """`configs`: label -> resolved spec (the spec as written, the tuned one). One server serves
    every variant; each is measured in turn."""
    first = next(iter(configs.values()))
    slo_ms = first.model(model).slo.p95_ms
    if slo_ms is None:
        raise ValueError("the model needs slo.p95_ms")  # checked by the command first
    names = {label: (f"{model}__{label}", f"{model}__{label}_free") for label in configs}
    models = []
    for label, spec in configs.items():  # each label's model and its policy-free copy, from its own spec
        name, free = names[label]
        models += [_renamed(spec, model, name), _renamed(spec, model, free, free=True)]
    served = Spec(first.data.model_copy(update={"models": models}), first.path, first.shown, first.source)
    generate(served, repo)
    server_cpus, generator_cpus = split_cores()
    result = {"schema": SCHEMA, "kind": "bench/overload", "model": model, "slo_p95_ms": slo_ms,
              "factors": list(FACTORS), "server_cpus": sorted(server_cpus or []),
              "generator_cpus": sorted(generator_cpus or []), "configs": {}}
    log(f"server on cores {sorted(server_cpus or [])}, load generator on {sorted(generator_cpus or [])}")
    ports = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
    with running(served, repo, state_dir, ports=ports, log=log, cpus=server_cpus) as r, _pinned(generator_cpus):
        for label, spec in configs.items():
            m = spec.model(model)
            log(f"== {label}: {m.instances.count} instance(s), priority levels {m.batching.priority_levels}, "
                f"queue {policy_label(m.batching)}")
            result["configs"][label] = {"policy": policy_label(m.batching), "instances": m.instances.count,
                                        **asyncio.run(_bench_config(r.endpoints.grpc, *names[label], slo_ms,
                                                                    seconds, log))}
    out_dir.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out_dir / "bench_overload.json", json.dumps(result, indent=2).encode())
    return result


def policy_label(b) -> str:
    def one(q) -> str:
        return "none" if q is None else f"{q.max_queue_size or 'unbounded'}/{q.default_timeout_us / 1000:g}ms"
    parts = [f"default {one(b.default_queue_policy)}"]
    parts += [f"p{lv} {one(q)}" for lv, q in sorted(b.priority_queue_policies.items())]
    return ", ".join(parts)
