"""`make demo`: the whole loop on this machine with a real tritonserver on the CPU.

sample model -> configs -> serve -> a concurrent burst (latency and batch statistics) -> a short
headless Locust load test with two priority classes -> a short batch-size sweep and its report -> stop
-> the tuner for the model's SLO, before and after -> the tuned config served behind the gateway
(Envoy, at the in-flight limit the tuner measured), offered twice its claim.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tritonkit import sample_model
from tritonkit.clients.burst import burst
from tritonkit.configs.gateway import in_flight_limit, queues_said
from tritonkit.configs.generate import generate
from tritonkit.configs.loader import resolve
from tritonkit.configs.steps import gateway_in_front, serve_configured
from tritonkit.errors import KitError
from tritonkit.gateway import envoy_binary
from tritonkit.loadtests.asyncgen import run_load
from tritonkit.loadtests.load import Load, RequestClass
from tritonkit.loadtests.measure import measure_by
from tritonkit.loadtests.overload_figures import overload_figures
from tritonkit.loadtests.results import format_result, write_result
from tritonkit.serving import running
from tritonkit.spec import Admission, Spec
from tritonkit.stats import batch_histogram, summary_ms
from tritonkit.tuner.knobs import powers_of_two
from tritonkit.tuner.objective import Tuning
from tritonkit.tuner.outputs import admission_from
from tritonkit.tuner.run import tune_offline
from tritonkit.tuner.sweep import sweep
from tritonkit.tuner.trials import TrialWindow


def say(msg: str = "") -> None:
    print(msg, flush=True)


STEPS = 8
OVERLOAD = 2.0  # the gateway step offers this many times the claim, as the overload gate checks
# Two classes as an edge service has them: a few interactive requests ahead of bulk work.
CLASSES = [RequestClass("interactive", weight=1, priority=1), RequestClass("bulk", weight=3, priority=2)]


def run_demo(draft: Spec, repo: Path, state_dir: Path, requests: int = 2000, concurrency: int = 16,
             out: Path = Path("out/demo"), seconds: float = 4.0, tune_trials: int = 14) -> None:
    """`draft` is the command's parsed spec: its ONNX file may not exist yet (step 1 writes the
    sample model), so the rules that read the graph run here, once, after that step."""
    say(f"== 1/{STEPS} sample model")
    onnx_path = draft.onnx_path(draft.models[0])
    if onnx_path.exists():
        say(f"{onnx_path} already there")
    else:
        sample_model.write(onnx_path)
        say(f"wrote {onnx_path}")

    say(f"== 2/{STEPS} configs")
    spec = resolve(draft, repo)
    for r in generate(spec, repo):
        say(f"{r.config_path}: {'updated' if r.changed else 'unchanged'} (runtime {r.runtime})")
    model = spec.models[0].name

    say(f"== 3/{STEPS} serve (real tritonserver, free ports)")
    ports = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
    with running(spec, repo, state_dir, models=[model], ports=ports, log=say) as r:
        say(f"  HTTP {r.endpoints.http}  gRPC {r.endpoints.grpc}  metrics {r.endpoints.metrics}")
        say(f"== 4/{STEPS} burst: {requests} requests of batch 1 from {concurrency} concurrent gRPC clients")
        # Warm-up first: the first large batches pay ONNX Runtime's allocations; keep them out.
        asyncio.run(burst(r.endpoints.grpc, model, min(200, requests), concurrency))
        with r.client() as c:
            before = c.statistics(model)
            result = asyncio.run(burst(r.endpoints.grpc, model, requests, concurrency))
            after = c.statistics(model)
        report(result, batch_histogram(before, after))

        m = spec.model(model)
        rate = m.slo.rps or 300.0
        load = Load(rate=rate, duration_s=seconds, warmup_s=1.0)
        say(f"\n== 5/{STEPS} load test: Locust headless, {load.describe()}, interactive and bulk classes")
        lt = measure_by("locust", m.name, load, CLASSES, url=r.endpoints.http, metrics=r.endpoints.metrics,
                        log_dir=out / "loadtest")
        say(format_result(lt))
        js, _ = write_result(lt, out / "loadtest")
        say(f"wrote {js}")

        sizes = powers_of_two(min(max(m.max_batch_size, 1), 32))
        say(f"\n== 6/{STEPS} sweep over max batch sizes {sizes} at {rate:g} req/s, {seconds:g} s per row")
        files = sweep(r, spec, repo, model, Load(rate=rate, duration_s=seconds, warmup_s=1.0), out / "sweep",
                      batch_sizes=sizes, log=say)
        say(f"report: {files['report.md']}")

    slo = spec.model(model).slo
    say(f"\n== 7/{STEPS} tune for the SLO: P95 <= {slo.p95_ms:g} ms at {rate:g} req/s (the lowest P95 there)")
    # 3 s trials: the demo shows the loop; `tritonkit tune` measures longer ones (about 3000 requests)
    result = tune_offline(spec, model, repo, state_dir, out / "tune", rps=rate, max_trials=tune_trials,
                          window=TrialWindow(max_s=3.0),
                          log=say)
    t = result.tuning

    def row(name: str, score) -> str:
        tr = score.trial
        p95 = "-" if tr is None or tr.p95_ms is None else f"{tr.p95_ms:.1f} ms"
        err = "-" if tr is None else f"{100 * tr.error_ratio:.1f}%"
        return f"  {name:<7}{score.knobs.label():<48} P95 {p95:>9}   errors {err}"

    if t.kept:  # one config: a "before" and an "after" would be two measurements of it, not a change
        say(row("kept", t.best))
    else:
        say(row("before", t.baseline))
        say(row("after", t.best))
    say(f"report: {result.files['report.md']}" + (f"; decision: {result.files['tuned.yaml']}"
                                                   if "tuned.yaml" in result.files else " (not confirmed: no change)"))
    gateway_step(spec, model, t, rate, state_dir, out, seconds)


def gateway_step(spec: Spec, model: str, t: Tuning, rate: float, state_dir: Path, out: Path,
                 seconds: float) -> None:
    """The tuned config as `serve` runs it with `server.gateway.enabled`: Envoy in front, its limit
    what `tune` writes (the largest closed loop that held the SLO; Little's law at the claim where
    the tune wrote nothing), Triton's queues as they are behind it; then the claim doubled, in two
    classes, through Envoy."""
    claim = t.best.rate or rate
    say(f"\n== 8/{STEPS} the gateway: the tuned config behind Envoy, offered {OVERLOAD:g}x the claim "
        f"({claim:g} req/s)")
    try:
        envoy_binary()
    except KitError as e:
        say(f"  skipped: {e}")
        return
    p95 = t.best.trial.p95_ms if t.best.trial and t.best.trial.p95_ms else spec.model(model).slo.p95_ms
    limit = admission_from(t) or in_flight_limit(claim, p95)
    m = t.best.knobs.model(spec.model(model)).model_copy(update={"admission": Admission(max_in_flight=limit)})
    server = spec.server.model_copy(update={"gateway": spec.server.gateway.model_copy(update={"enabled": True})})
    gated = Spec(spec.with_model(m).data.model_copy(update={"server": server}), spec.path, spec.shown, spec.source)
    ports = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
    load = Load(rate=OVERLOAD * claim, duration_s=seconds, warmup_s=1.0)
    # its own repository: the demo's keeps the config the tune wrote, as `tritonkit configs` would
    with serve_configured(gated, out / "gateway" / "repository", state_dir / "gateway", models=[model],
                          ports=ports, log=say) as r, gateway_in_front(gated, r, state_dir / "gateway") as gw:
        say(f"  gateway {gw.url}: {gw.limits.describe()}\n  {queues_said(gated)}")
        outcome = asyncio.run(run_load(gw.url, model, load, CLASSES))
    slo_ms = spec.model(model).slo.p95_ms
    f = overload_figures(outcome, load, claim, slo_ms, gated.server.gateway.interactive_share)
    refusal = "-" if f["refusal_p95_ms"] is None else f"{f['refusal_p95_ms']:.1f} ms"
    interactive = "-" if f["interactive_within_ratio"] is None else f"{f['interactive_within_ratio']:.2f}"
    say(f"  offered {load.rate:.0f} req/s: {f['goodput_rps']:.0f} req/s answered within {slo_ms:g} ms "
        f"({f['goodput_ratio']:.2f} of the claim), {f['late']} late; {f['refused']} refused, P95 {refusal} "
        f"to learn it; interactive within the SLO {interactive} of its share")


def report(result, histogram: dict[int, int]) -> None:
    s = summary_ms(result.latencies_s)
    say(f"\nrequests  {result.sent} sent, {result.ok} ok, errors {dict(result.errors) or 'none'}")
    for kind, message in result.examples.items():
        say(f"  first {kind} error: {message[:160]}")
    say(f"throughput {result.throughput:.0f} req/s over {result.wall_s:.1f} s")
    say(f"latency   P50 {s['p50_ms']:.1f} ms   P95 {s['p95_ms']:.1f} ms   P99 {s['p99_ms']:.1f} ms   "
        f"max {s['max_ms']:.1f} ms")
    say("batch sizes Triton executed (from its statistics):")
    total = sum(histogram.values()) or 1
    width = max(histogram.values(), default=1)
    for size, count in histogram.items():
        bar = "#" * max(1, round(40 * count / width))
        say(f"  {size:>3} | {bar} {count} ({100 * count / total:.0f}%)")
    mean = sum(k * v for k, v in histogram.items()) / total
    say(f"mean batch {mean:.1f} requests per execution")
