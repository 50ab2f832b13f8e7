"""The batch-size sweep: the same load against max batch sizes 1, 2, 4 ... 64, one variable at a time.

A grid over the tuner's knobs (max batch and queue delay; the spec's instance count, and its
preferred sizes that fit each max batch). Per row: the knobs put in force by `tuner.apply`
(config written, reloaded, checked against what Triton reports), warm up, measure a steady
window, drain, and record latency, throughput, Triton's stage breakdown and the server's peak
memory. The spec's own config is restored at the end, whatever happened.

Swept by a pipeline's name, each row gives every model of the pipeline that max batch and delay
together (each keeps its instance count and the preferred sizes that fit), puts them in force as
joint tuning does (`tuner.mix.MixBox`) and measures the pipeline end to end, with each step's
queue and compute in the row.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psutil

from tritonkit.errors import ServerError
from tritonkit.input_rules import edges_text
from tritonkit.loadtests.load import Load, RequestClass
from tritonkit.loadtests.measure import measure_by, measure_grpc
from tritonkit.loadtests.report import write_sweep_report
from tritonkit.serving import Running
from tritonkit.spec import Spec
from tritonkit.tuner import remote
from tritonkit.tuner.apply import LiveConfig, Served
from tritonkit.tuner.knobs import Knobs, grid, powers_of_two
from tritonkit.tuner.mix import MixBox

MAX_BATCH = 64  # the sweep's default top row (the batch-size study's 1, 2, 4 ... 64)


class PeakRss:
    """Samples the summed RSS of the server and its stubs every 50 ms while a row runs (None where
    the server is not a process of this machine)."""

    def __init__(self, pid: int | None):
        self.pid, self.peak_mb, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
                mb = sum(p.memory_info().rss for p in procs) / 2**20
                self.peak_mb = max(self.peak_mb, mb)
            except psutil.Error:
                pass
            self._stop.wait(0.05)

    def __enter__(self) -> PeakRss:
        if self.pid is None:
            self.peak_mb = None
        else:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.pid is not None:
            self._thread.join()


def row_from(result: dict, max_batch: int, delay_us: int, peak_mb: float | None,
             edges: tuple[int, ...] | None = None) -> dict:
    """`edges`: the bucket edges the row's requests were padded to (None: the spec's, not swept)."""
    o, s = result["overall"], result["server"]
    swept = {} if edges is None else {"bucket_edges": list(edges), "padding_waste": result.get("padding_waste")}
    return {
        "max_batch_size": max_batch, "max_queue_delay_us": delay_us, **swept,
        "requests": o["requests"], "ok": o["ok"], "errors": o["errors"],
        "duration_s": result["load"]["duration_s"], "throughput_rps": o["throughput_rps"],
        **{k: o[k] for k in ("mean_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms")},
        "peak_rss_mb": peak_mb,
        "server": {k: s.get(k) or 0.0 for k in ("queue_ms", "compute_input_ms", "compute_infer_ms",
                                                "compute_output_ms")},
        "client_overhead_ms": result["client_overhead_ms"] or 0.0,
        "batch_histogram": s["batch_histogram"],
        "generator_warning": result["generator"]["warning"],
    }


def sweep(r: Running, spec: Spec, repo: Path, model: str, load: Load, out_dir: Path, *,
          batch_sizes: list[int] | None = None, delays_us: list[int] | None = None,
          classes: list[RequestClass] | None = None, input_data: Path | None = None,
          max_rss_mb: float | None = None, edge_sets: list[tuple[int, ...]] | None = None,
          log: Callable[[str], None] = print) -> dict[str, Path]:
    """`max_rss_mb`: the server's peak RSS a recommended setting may reach (the whole process, its
    stubs included; not `memory_budget_mb`, which bounds the model's own memory in the plan).
    `edge_sets`: bucket edges to pad to (tuner/buckets.py), each row of the grid with each."""
    if spec.pipeline(model) is not None:
        return sweep_pipeline(r, spec, repo, model, load, out_dir, batch_sizes=batch_sizes, delays_us=delays_us,
                              classes=classes, input_data=input_data, log=log)
    live = LiveConfig(Served(r), spec, repo, model)  # last-known-good: the spec's own config
    return _sweep(live, spec, model, load, out_dir, url=r.endpoints.grpc, metrics=r.endpoints.metrics,
                  pid=r.server.proc.pid, batch_sizes=batch_sizes, delays_us=delays_us, classes=classes,
                  input_data=input_data, max_rss_mb=max_rss_mb, edge_sets=edge_sets, log=log)


def sweep_remote(url: str, spec: Spec, repo: Path | None, model: str, load: Load, out_dir: Path, *,
                 headers: dict[str, str], key_env: str, in_place: bool = False,
                 batch_sizes: list[int] | None = None, delays_us: list[int] | None = None,
                 classes: list[RequestClass] | None = None, input_data: Path | None = None,
                 log: Callable[[str], None] = print) -> dict[str, Path]:
    """The same rows on a server the kit did not start (`tuner/remote.py`): a shadow copy by default,
    the original config back and verified at the end. Its memory is not this machine's to read."""
    with remote.session(url, model, headers, key_env, repo, in_place, log) as (server, served):
        spec = remote.served_knobs(served.config).apply(spec, model)  # each row varies the served config
        live = LiveConfig(server, spec, repo, model, log, target=remote.ThroughApi(server, served))
        return _sweep(live, spec, model, load, out_dir, url=url, metrics=None, pid=None, batch_sizes=batch_sizes,
                      delays_us=delays_us, classes=classes, input_data=input_data, log=log)


def _sweep(live: LiveConfig, spec: Spec, model: str, load: Load, out_dir: Path, *, url: str, metrics: str | None,
           pid: int | None, batch_sizes: list[int] | None, delays_us: list[int] | None,
           classes: list[RequestClass] | None, input_data: Path | None, log: Callable[[str], None],
           max_rss_mb: float | None = None, edge_sets: list[tuple[int, ...]] | None = None) -> dict[str, Path]:
    rows = []
    m = spec.model(model)
    preferred = m.batching.preferred_batch_sizes
    points = grid(batch_sizes or powers_of_two(MAX_BATCH), delays_us or [m.batching.max_queue_delay_us],
                  [m.instances.count], preferred_of=lambda b: [s for s in preferred if s <= b])
    if edge_sets:  # edge set by edge set, the grid under each: a series per padding in the plots
        points = [replace(k, edges=e) for e in edge_sets for k in points]
    try:
        for k in points:
            refused = live.apply_knobs(spec, k)
            if refused:
                raise ServerError(f"max_batch {k.max_batch}, delay {k.delay_us} us: {refused}")
            with PeakRss(pid) as rss:
                result = measure_grpc(url, live.served_name, load, classes, metrics=metrics, input_data=input_data)
            row = row_from(result, k.max_batch, k.delay_us, rss.peak_mb, k.edges)
            rows.append(row)
            note = "  (generator-limited)" if row["generator_warning"] else ""
            memory = f"  peak RSS {row['peak_rss_mb']:.0f} MB" if row["peak_rss_mb"] is not None else ""
            padded = "" if k.edges is None else f" pad {edges_text(k.edges)}"
            log(f"  [{len(rows)}/{len(points)}] max_batch {k.max_batch:>2} delay {k.delay_us:>6} us{padded}: "
                f"{row['throughput_rps']:7.1f} req/s  P95 {row['p95_ms']:7.2f} ms{memory}{note}")
    finally:
        live.reset()  # back to what the spec (or the server) had, verified
    return write_sweep_report(rows, out_dir, slo_p95_ms=m.slo.p95_ms, max_rss_mb=max_rss_mb,
                              title=f"Batch-size sweep: {model}",
                              load=f"{load.describe()}; {load.warmup_s:g} s warm-up, {load.duration_s:g} s steady")


def sweep_pipeline(r: Running, spec: Spec, repo: Path, name: str, load: Load, out_dir: Path, *,
                   batch_sizes: list[int] | None = None, delays_us: list[int] | None = None,
                   classes: list[RequestClass] | None = None, input_data: Path | None = None,
                   log: Callable[[str], None] = print) -> dict[str, Path]:
    steps = spec.steps_of(name)
    first = spec.model(steps[0])
    points = grid(batch_sizes or powers_of_two(MAX_BATCH), delays_us or [first.batching.max_queue_delay_us], [1])
    box = MixBox(spec, repo, r, log)
    rows = []
    try:
        for k in points:
            configs = {s: Knobs(k.max_batch, k.delay_us, spec.model(s).instances.count, preferred_sizes=tuple(
                p for p in spec.model(s).batching.preferred_batch_sizes if p <= k.max_batch)) for s in steps}
            refused = box.apply(configs)
            if refused:
                raise ServerError(f"max_batch {k.max_batch}, delay {k.delay_us} us: {refused}")
            box.keep()
            with PeakRss(r.server.proc.pid) as rss:
                result = measure_by("asyncio", name, load, classes, url=r.endpoints.grpc, metrics=r.endpoints.metrics,
                                    input_data=input_data, steps=steps)
            row = row_from(result, k.max_batch, k.delay_us, rss.peak_mb)
            row["steps"] = result["steps"]
            rows.append(row)
            per_step = ", ".join(f"{s['model']} {s['queue_ms'] or 0:.1f}+{s['compute_ms'] or 0:.1f} ms"
                                 for s in result["steps"])
            log(f"  [{len(rows)}/{len(points)}] max_batch {k.max_batch:>2} delay {k.delay_us:>6} us: "
                f"{row['throughput_rps']:7.1f} req/s  P95 {row['p95_ms']:7.2f} ms  (queue+compute: {per_step})")
    finally:
        box.live.reset()  # back to what the spec says, every changed model verified
    return write_sweep_report(rows, out_dir, slo_p95_ms=spec.slo_of(name).p95_ms, title=f"Batch-size sweep: {name}",
                              load=f"{load.describe()}; {load.warmup_s:g} s warm-up, {load.duration_s:g} s steady")
