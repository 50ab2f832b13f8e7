"""`make demo`: the whole loop on this machine with a real tritonserver on the CPU.

sample model -> configs -> serve -> a concurrent burst (latency and batch statistics) -> a short
headless Locust load test with two priority classes -> a short batch-size sweep and its report -> stop
-> the tuner for the model's SLO, before and after.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tritonkit import sample_model
from tritonkit.clients.burst import burst
from tritonkit.configs.generate import generate
from tritonkit.configs.loader import resolve
from tritonkit.loadtests.load import Load, RequestClass
from tritonkit.loadtests.measure import measure_by
from tritonkit.loadtests.results import format_result, write_result
from tritonkit.serving import running
from tritonkit.spec import Spec
from tritonkit.stats import batch_histogram, summary_ms
from tritonkit.tuner.knobs import powers_of_two
from tritonkit.tuner.run import tune_offline
from tritonkit.tuner.sweep import sweep
from tritonkit.tuner.trials import TrialWindow


def say(msg: str = "") -> None:
    print(msg, flush=True)


STEPS = 7
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
