"""`tritonkit bench overload` (`make bench`): what each way of refusing load does when more arrives
than the server can take, for the spec's config as written and the tuned one (tuned.yaml).

The capacity is the claim a tuner makes: the highest Poisson rate at which P95 <= SLO, measured in
this run on a copy of the model without queue policy or priority levels (Triton's prefetch on, the
most its batch size and instances serve within the SLO). An ideal admission control serves exactly
that rate within the SLO whatever arrives, and turns the rest away at once. Behind a gateway the
claim is the one measured through it (an Envoy that only proxies), as `tune --url` through the
gateway makes it: the proxy's latency and its share of the server's cores belong to that
deployment, and its admission can keep no more. Each row also gives its goodput over the claim
without the gateway, so its cost stays in view. Eight approaches, each at 0.8x, 1.5x, 2x and 3x its
claim, interleaved run by run so that a noisy minute on this shared box falls on all of them alike.
Every gateway's limit counts interactive requests in it (configs/gateway.py `split`).

- queue_policy: Triton alone, the config as written (its priority levels and queue policies);
- gateway_fixed: Envoy in front of the policy-free copy, its circuit breaker at the in-flight
  limit Little's law gives at the claim with room for Poisson bursts, L + 3 sqrt(L)
  (configs/gateway.py), its route timeout the SLO where Triton survives cancellations;
- gateway_little: the same at L alone, L = claim x P95 there: under overload the breaker keeps the
  whole limit in flight, so room above L is wait above what the claim measured;
- gateway_closed: the limit `tune` writes, the largest closed loop through the gateway that held
  the SLO less the tuner's margin (tuner/in_flight.py, at most gateway_fixed's; measured on the
  copy behind it), in front of a copy with Triton's priority levels and no queue policy: the
  gateway bounds the queue, Triton serves interactive requests first within it, and nothing bounded
  stalls the batcher (2.51 still turns its prefetch off under priority levels);
- gateway_adaptive: that limit behind Envoy's adaptive concurrency filter, which moves the limit
  to keep the P95 it samples at 0.9 of the SLO (configs/gateway.py `adaptive_target_ms`), in front
  of the policy-free copy;
- gateway_priority: the same adaptive Envoy in front of gateway_closed's copy: what `serve` runs
  with the gateway on by default;
- gateway_policy: the same Envoy in front of the config as written, its queue policies kept: what
  `serve` runs when a spec turns the gateway on and keeps its policies;
- client_throttle: no gateway; the client refuses locally by the SRE formula (clients/throttle.py)
  and sends each request with the SLO as its gRPC deadline.

A quarter of the traffic is interactive: priority 1 for Triton's queues, the HIGH route for the
gateway (both behind gateway_closed, gateway_priority and gateway_policy). Reported per run, all
measured here: goodput (answered within the SLO per second) over the claim; interactive requests
answered within the SLO over min(those offered, a quarter of the claim); a refusal's P95 (every
failure but a deadline, which takes the SLO by construction); late answers (accepted and answered
after the SLO, or still out after the drain); the CPU each process used.

Overload is the server's to handle, not the machine's: the server, its backend stubs and the
gateways (sidecars in a pod) share half the cores, the generator has the other half, and the
result names both sets. Then the gateway's own cost: direct and through the gateway at half the
claim, A B B A.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from tritonkit.benchmarks.claim import DRAIN_S, claim_rate, in_flight_bound
from tritonkit.benchmarks.cores import pinned, split_cores
from tritonkit.benchmarks.pod_cpu import Pod, chart_requests, in_container, pod_cpu
from tritonkit.clients import AsyncClient
from tritonkit.clients.throttle import AdaptiveThrottle, ThrottledClient
from tritonkit.configs.gateway import GatewayLimits, Upstream, bootstrap, in_flight_limit, queues_behind
from tritonkit.configs.gateway import write as write_gateway
from tritonkit.configs.generate import generate
from tritonkit.files import write_bytes_atomic
from tritonkit.gateway import LocalEnvoy
from tritonkit.loadtests.asyncgen import run_load
from tritonkit.loadtests.load import Load, Outcome, RequestClass
from tritonkit.loadtests.overload_figures import overload_figures
from tritonkit.loadtests.results import SCHEMA
from tritonkit.server import free_port
from tritonkit.serving import running
from tritonkit.spec import GatewaySpec, Spec
from tritonkit.stats import medians, percentile
from tritonkit.support import cancels_safely

FACTORS = (0.8, 1.5, 2.0, 3.0)
RUNS = 3
INTERACTIVE_SHARE = 0.25
APPROACHES = ("queue_policy", "gateway_fixed", "gateway_little", "gateway_adaptive", "gateway_closed",
              "gateway_priority", "gateway_policy", "client_throttle")
THROTTLE_K = 2.0  # the SRE book's suggestion
# Triton's queues see the priority; on the policy-free copy (no priority levels) both classes are
# priority 0 and the gateway tells them apart by the class header run_load sends.
CLASSES = [RequestClass("interactive", weight=1, priority=1), RequestClass("bulk", weight=3, priority=0)]
FREE_CLASSES = [RequestClass("interactive", weight=1), RequestClass("bulk", weight=3)]


@dataclass(frozen=True)
class Copies:
    """One config's model served three ways, under these names."""

    written: str  # its queue policies and priority levels as written
    free: str  # neither: Triton's prefetch on, the claim measured here
    priority: str  # priority levels (two, where it has none) and no queue policy


def _renamed(spec: Spec, model: str, name: str, queues: str = "written"):
    """The model under another name, its queues `written`, `free` or `priority` (see Copies)."""
    m = spec.model(model).model_copy(update={"name": name})
    if queues == "priority":
        return queues_behind(m)  # as `serve` writes it behind the gateway
    if queues == "free":
        b = m.batching.model_copy(update={"priority_levels": 0, "default_priority": 0,
                                          "default_queue_policy": None, "priority_queue_policies": {}})
        m = m.model_copy(update={"batching": b})
    return m


class CpuMeter:
    """CPU time of named processes between two calls, as percent of one core: `trees` with their
    children (a server and its backend stubs), `alone` without (this process, whose children are
    the server and the gateways)."""

    def __init__(self, trees: dict[str, int], alone: dict[str, int]):
        self.trees = {name: [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
                      for name, pid in trees.items()}
        self.trees |= {name: [psutil.Process(pid)] for name, pid in alone.items()}
        self._t0, self._cpu0 = time.perf_counter(), self._times()

    def _times(self) -> dict[str, float]:
        out = {}
        for name, procs in self.trees.items():
            total = 0.0
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    total += sum(p.cpu_times()[:2])
            out[name] = total
        return out

    def reset(self) -> None:
        self._t0, self._cpu0 = time.perf_counter(), self._times()

    def percent(self) -> dict[str, float]:
        wall, now = time.perf_counter() - self._t0, self._times()
        return {name: round(100 * (now[name] - self._cpu0[name]) / wall, 1) for name in now}


@dataclass(frozen=True)
class Approach:
    """Where one approach sends its load and how, and the claim its loads are factors of."""

    name: str
    url: str
    model: str
    classes: list[RequestClass]
    claim: float = 0.0
    throttled: bool = False


async def _send(a: Approach, load: Load, slo_ms: float, seed: int, throttle_k: float = THROTTLE_K) -> Outcome:
    if not a.throttled:
        return await run_load(a.url, a.model, load, a.classes, seed=seed)
    async with AsyncClient(a.url) as client:
        target = ThrottledClient(client, AdaptiveThrottle(throttle_k), slo_ms / 1000)
        return await run_load(a.url, a.model, load, a.classes, seed=seed, target=target)


@contextlib.contextmanager
def sidecar_gateways(grpc_port: int, limits: dict[str, GatewayLimits], folder: Path, cpus: set[int] | None,
              pod: Pod | None = None):
    """An Envoy per named limits in front of the server's gRPC port, on the server's cores (in the
    gateway container's cgroup)."""
    with contextlib.ExitStack() as stack:
        started = {}
        with pinned(cpus), in_container(pod, "gateway"):  # a child keeps the affinity and cgroup it was started with
            for name, own in limits.items():
                port, admin = free_port(), free_port()
                config = folder / f"{name}.json"
                write_gateway(config, bootstrap(port, Upstream(grpc_port=grpc_port), admin, own))
                envoy = stack.enter_context(LocalEnvoy(config, admin, folder / f"{name}.log"))
                started[name] = (f"127.0.0.1:{port}", envoy)
        yield started


def gateway_limits(claim_rps: float, p95_ms: float, deadline_ms: float | None, slo_ms: float,
                   measured: int) -> dict:
    """Each gateway approach's own Envoy: from the claim and the P95 measured there (Little's law),
    or from the largest closed loop that held the SLO (`measured`, as `tune` writes it)."""
    at_claim = (claim_rps, p95_ms, deadline_ms, INTERACTIVE_SHARE)
    return {"gateway_fixed": GatewayLimits.from_claim(*at_claim),
            "gateway_little": GatewayLimits.from_claim(*at_claim, burst_sds=0),
            "gateway_adaptive": GatewayLimits.of(measured, deadline_ms, INTERACTIVE_SHARE, adaptive_slo_ms=slo_ms),
            "gateway_closed": GatewayLimits.of(measured, deadline_ms, INTERACTIVE_SHARE)}


# An approach measured through another's Envoy (its CPU is that Envoy's): that Envoy, and the copy it loads
SHARED_GATEWAY = {"gateway_priority": ("gateway_adaptive", "priority"),
                  "gateway_policy": ("gateway_adaptive", "written")}
# The copy an approach with an Envoy of its own loads, where not the policy-free one
OWN_COPY = {"gateway_closed": "priority"}


# The claim's own gateway: Envoy with a breaker far above anything in flight and no deadline, a
# proxy and nothing more, so that a claim through it is what `tune --url` through the gateway finds
PROXY = GatewayLimits(max_requests=100_000, max_requests_high=100_000, timeout_ms=None)


def _approaches(direct: str, copies: Copies, gateways: dict, chosen: tuple[str, ...],
                claim: float, gateway_claim: float) -> list[Approach]:
    """Each approach at its own claim: behind the gateway, the one measured through it."""
    every = [Approach("queue_policy", direct, copies.written, CLASSES, claim),
             *(Approach(g, url, getattr(copies, OWN_COPY.get(g, "free")), CLASSES if g in OWN_COPY else FREE_CLASSES,
                        gateway_claim) for g, (url, _) in gateways.items()),
             *(Approach(p, gateways[g][0], getattr(copies, copy), CLASSES, gateway_claim)
               for p, (g, copy) in SHARED_GATEWAY.items()),
             Approach("client_throttle", direct, copies.free, FREE_CLASSES, claim, throttled=True)]
    return [a for a in every if a.name in chosen]


async def _added_latency(direct: Approach, gateway: Approach, rate: float, seconds: float) -> dict:
    """P50 and P95 direct and through the gateway at `rate`, A B B A."""
    figures: dict[str, list[float]] = {"direct": [], "gateway": []}
    per_run: dict[str, list[dict]] = {"direct": [], "gateway": []}
    for i, (label, a) in enumerate([("direct", direct), ("gateway", gateway), ("gateway", gateway),
                                    ("direct", direct)]):
        out = await _send(a, Load(rate=rate, duration_s=seconds, warmup_s=1.0, drain_s=DRAIN_S), 1e9, seed=i)
        ok = [s.latency_s * 1e3 for s in out.samples if s.latency_s is not None]
        figures[label] += ok
        per_run[label].append({"p50_ms": round(percentile(ok, 50), 3), "p95_ms": round(percentile(ok, 95), 3)})
    result = {label: {"p50_ms": round(percentile(ms, 50), 3), "p95_ms": round(percentile(ms, 95), 3),
                      "runs": per_run[label]} for label, ms in figures.items()}
    result["added_p50_ms"] = round(result["gateway"]["p50_ms"] - result["direct"]["p50_ms"], 3)
    result["added_p95_ms"] = round(result["gateway"]["p95_ms"] - result["direct"]["p95_ms"], 3)
    return result


def median_row(runs: list[dict]) -> dict:
    """The runs of one approach at one factor: each figure's median, min and max."""
    out = medians(runs, ("goodput_ratio", "goodput_direct_ratio", "interactive_within_ratio", "refusal_p95_ms",
                         "late"))
    out["cpu_percent"] = {name: statistics.median(r["cpu_percent"][name] for r in runs)
                          for name in runs[0]["cpu_percent"]}
    out["generator_limited_runs"] = sum(r["generator_limited"] for r in runs)
    return out


async def _bench_config(r, label: str, copies: Copies, slo_ms: float, seconds: float, runs: int,
                        folder: Path, server_cpus: set[int] | None, generator_cpus: set[int] | None,
                        log: Callable[[str], None], throttle_k: float = THROTTLE_K,
                        chosen: tuple[str, ...] = APPROACHES, pod: Pod | None = None) -> dict:
    direct, free = r.endpoints.grpc, copies.free
    with pinned(generator_cpus):
        claim = await claim_rate(direct, free, slo_ms, seconds, log)
    rate = claim["claim_rps"]
    if not rate:
        log("  no rate held the SLO on the policy-free copy: nothing to overload")
        return {**claim, "approaches": {}}
    # Behind a gateway the claim is the one made through it, as `tune --url` through the gateway
    # makes it: the proxy's latency and its share of the server's cores are the deployment's, and
    # an admission control can keep no more than that claim
    gateway_rate, gateway_p95, through, bound = rate, claim["claim_p95_ms"], {}, {}
    if any(a.startswith("gateway_") for a in chosen):
        with sidecar_gateways(r.endpoints.grpc_port, {"proxy": PROXY}, folder, server_cpus, pod) as proxy, \
                pinned(generator_cpus):
            log("  the claim through the gateway (a proxy, no limit):")
            through = await claim_rate(proxy["proxy"][0], free, slo_ms, seconds, log)
            gateway_rate = through.get("claim_rps") or rate
            gateway_p95 = through.get("claim_p95_ms") or gateway_p95
            # what `tune` writes: the most in flight whose closed loop holds the SLO, through the
            # gateway, on the copy served behind it (priority levels turn 2.51's prefetch off)
            bound = await in_flight_bound(proxy["proxy"][0], copies.priority, slo_ms, seconds,
                                          in_flight_limit(gateway_rate, gateway_p95), log, CLASSES)
    # The SLO as the gateway's deadline only where Triton survives the cancellations it causes
    # (support.cancels_safely); elsewhere the in-flight limit alone bounds the wait
    with r.client() as c:
        deadline = slo_ms if cancels_safely(c.server_version()) else None
    limits = gateway_limits(gateway_rate, gateway_p95, deadline, slo_ms,
                            bound.get("in_flight") or in_flight_limit(gateway_rate, gateway_p95))
    for g, own in limits.items():
        log(f"  {g}: {own.describe()}")
    with sidecar_gateways(r.endpoints.grpc_port, limits, folder, server_cpus, pod) as gateways, pinned(generator_cpus):
        approaches = _approaches(direct, copies, gateways, chosen, rate, gateway_rate)
        meter = CpuMeter({"server": r.server.proc.pid},
                         {"generator": os.getpid(), **{n: e.proc.pid for n, (_, e) in gateways.items()}})
        rows: dict[str, dict[str, list[dict]]] = {a.name: {str(f): [] for f in FACTORS} for a in approaches}
        for run in range(runs):
            for f in FACTORS:
                for a in approaches:
                    meter.reset()
                    load = Load(rate=f * a.claim, duration_s=seconds, warmup_s=1.0, drain_s=DRAIN_S)
                    out = await _send(a, load, slo_ms, seed=run, throttle_k=throttle_k)
                    cpu = meter.percent()
                    own = {"server": cpu["server"], "generator": cpu["generator"],
                           "gateway": cpu.get(SHARED_GATEWAY.get(a.name, (a.name,))[0], 0.0)}  # its Envoy
                    figures = overload_figures(out, load, a.claim, slo_ms, INTERACTIVE_SHARE)
                    row = {"run": run, **figures, "cpu_percent": own}
                    row["goodput_direct_ratio"] = round(row["goodput_rps"] / rate, 3)  # over the claim without it
                    rows[a.name][str(f)].append(row)
                    log(f"  run {run + 1} " + format_row(a.name, f, row))
        added = await _added_latency(Approach("direct", direct, free, FREE_CLASSES),
                                     Approach("gateway", gateways["gateway_fixed"][0], free, FREE_CLASSES),
                                     rate / 2, seconds)
        log(f"  gateway's added latency at {rate / 2:.0f} req/s: P50 {added['direct']['p50_ms']:.2f} -> "
            f"{added['gateway']['p50_ms']:.2f} ms, P95 {added['direct']['p95_ms']:.2f} -> "
            f"{added['gateway']['p95_ms']:.2f} ms")
    summary = {a: {f: median_row(fr) for f, fr in by_factor.items()} for a, by_factor in rows.items()}
    return {**claim, "gateway_claim": through or None, "in_flight_bound": bound or None,
            "limits": {g: dataclasses.asdict(own) for g, own in limits.items()},
            "approaches": summary, "runs": rows, "added_latency": added}


def _ms(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def format_row(approach: str, factor: float, r: dict) -> str:
    cpu = r["cpu_percent"]
    ratio = r["interactive_within_ratio"]
    return (f"{approach:<17} {factor:>4g}x {r['offered_rps']:>7.0f}/s  goodput {r['goodput_ratio']:.2f}  "
            f"interactive {'-' if ratio is None else f'{ratio:.2f}'}  refusal P95 {_ms(r['refusal_p95_ms']):>6} ms  "
            f"late {r['late']}  cpu server {cpu['server']:.0f}% gateway {cpu['gateway']:.0f}% "
            f"generator {cpu['generator']:.0f}%{'  (generator-limited)' if r['generator_limited'] else ''}")


def format_table(label: str, result: dict) -> list[str]:
    """The medians (min-max over the runs) of one config, an approach per block."""
    def span(fig) -> str:
        if fig is None:
            return "-"
        return f"{fig['median']:.2f} ({fig['min']:.2f}-{fig['max']:.2f})"

    through = result.get("gateway_claim") or {}
    gateway = (f"; through the gateway {through['claim_rps']:.0f} req/s, P95 there "
               f"{_ms(through.get('claim_p95_ms'))} ms" if through.get("claim_rps") else "")
    lines = [f"{label}: claim {result['claim_rps']:.0f} req/s, P95 there {_ms(result.get('claim_p95_ms'))} ms"
             + gateway + " (a gateway's loads and goodput are of the claim through it)",
             f"  {'approach':<17} {'load':>5}  {'goodput/claim':<18} {'of the direct claim':<20} "
             f"{'interactive':<18} {'refusal P95 ms':<20} {'late':<10} cpu server/gateway/generator %"]
    for approach, by_factor in result.get("approaches", {}).items():
        for f, m in by_factor.items():
            cpu = m["cpu_percent"]
            late = "-" if m["late"] is None else f"{m['late']['max']:.0f} max"
            lines.append(f"  {approach:<17} {float(f):>4g}x  {span(m['goodput_ratio']):<18} "
                         f"{span(m.get('goodput_direct_ratio')):<20} "
                         f"{span(m['interactive_within_ratio']):<18} {span(m['refusal_p95_ms']):<20} "
                         f"{late:<10} "
                         f"{cpu['server']:.0f}/{cpu['gateway']:.0f}/{cpu['generator']:.0f}")
    return lines


def served_copies(configs: dict[str, Spec], model: str) -> tuple[Spec, dict[str, Copies]]:
    """One spec serving each label's three copies of `model`, each from its label's own spec."""
    names = {label: Copies(f"{model}__{label}", f"{model}__{label}_free", f"{model}__{label}_prio")
             for label in configs}
    models = []
    for label, spec in configs.items():
        c = names[label]
        models += [_renamed(spec, model, c.written), _renamed(spec, model, c.free, "free"),
                   _renamed(spec, model, c.priority, "priority")]
    first = next(iter(configs.values()))
    # the bench starts its own Envoys: each copy is written with its queues as named here
    server = first.server.model_copy(update={"gateway": GatewaySpec()})
    data = first.data.model_copy(update={"models": models, "server": server})
    return Spec(data, first.path, first.shown, first.source), names


def run_overload_bench(configs: dict[str, Spec], model: str, repo: Path, state_dir: Path, out_dir: Path, *,
                       seconds: float = 4.0, runs: int = RUNS, throttle_k: float = THROTTLE_K,
                       approaches: tuple[str, ...] = APPROACHES, pod: bool = True,
                       log: Callable[[str], None] = print) -> dict:
    """`configs`: label -> resolved spec (the spec as written, the tuned one). One server serves
    every variant; each is measured in turn, by `approaches` (each gateway is started whichever run:
    the added latency is measured through the fixed one). `pod`: the server and the gateways in a
    CPU cgroup each, weighted as the chart's pod weights them (benchmarks/pod_cpu.py), where this
    machine allows; else in this process's."""
    first = next(iter(configs.values()))
    slo_ms = first.model(model).slo.p95_ms
    if slo_ms is None:
        raise ValueError("the model needs slo.p95_ms")  # checked by the command first
    served, names = served_copies(configs, model)
    generate(served, repo)
    server_cpus, generator_cpus = split_cores()
    result = {"schema": SCHEMA, "kind": "bench/overload", "model": model, "slo_p95_ms": slo_ms,
              "factors": list(FACTORS), "runs": runs, "approaches": list(approaches),
              "interactive_share": INTERACTIVE_SHARE, "throttle_k": throttle_k,
              "server_cpus": sorted(server_cpus or []), "generator_cpus": sorted(generator_cpus or []),
              "configs": {}}
    log(f"server and gateways on cores {sorted(server_cpus or [])}, load generator on {sorted(generator_cpus or [])}")
    ports = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
    folder = Path(state_dir) / "overload"
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        cgroups = stack.enter_context(pod_cpu(chart_requests())) if pod else None
        result["pod_cpu"] = cgroups.describe() if cgroups else None
        log(f"CPU: {cgroups.describe()}" if cgroups else "CPU: the server and the gateways in this process's cgroup")
        with in_container(cgroups, "triton"):  # Triton's backend stubs, started by it later, stay in its cgroup
            r = stack.enter_context(running(served, repo, state_dir, ports=ports, log=log, cpus=server_cpus))
        for label, spec in configs.items():
            m = spec.model(model)
            log(f"== {label}: {m.instances.count} instance(s), priority levels {m.batching.priority_levels}, "
                f"queue {policy_label(m.batching)}")
            result["configs"][label] = {
                "policy": policy_label(m.batching), "instances": m.instances.count,
                "tuned_in_flight": m.admission.max_in_flight,
                **asyncio.run(_bench_config(r, label, names[label], slo_ms, seconds, runs, folder, server_cpus,
                                            generator_cpus, log, throttle_k, approaches, cgroups))}
    for label, res in result["configs"].items():
        for line in format_table(label, res):
            log(line)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out_dir / "bench_overload.json", json.dumps(result, indent=2).encode())
    return result


def policy_label(b) -> str:
    def one(q) -> str:
        return "none" if q is None else f"{q.max_queue_size or 'unbounded'}/{q.default_timeout_us / 1000:g}ms"
    parts = [f"default {one(b.default_queue_policy)}"]
    parts += [f"p{lv} {one(q)}" for lv, q in sorted(b.priority_queue_policies.items())]
    return ", ".join(parts)
