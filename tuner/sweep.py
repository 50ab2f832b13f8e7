"""The batch-size sweep: the same load against max batch sizes 1, 2, 4 ... 64, one variable at a time.

Per row: rewrite config.pbtxt from a variant of the spec, reload it through model control, warm
up, measure a steady window, drain, and record latency, throughput, Triton's stage breakdown and
the server's peak memory. The spec's own config is restored at the end, whatever happened.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import psutil

from tritonkit.configs.generate import generate
from tritonkit.loadtests.load import Load, RequestClass
from tritonkit.loadtests.measure import measure
from tritonkit.loadtests.report import write_sweep_report
from tritonkit.serving import Running
from tritonkit.spec import Spec

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


class PeakRss:
    """Samples the summed RSS of the server and its stubs every 50 ms while a row runs."""

    def __init__(self, pid: int):
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
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def variant(spec: Spec, model: str, max_batch: int, delay_us: int | None) -> Spec:
    m = spec.model(model)
    b = m.batching
    batching = b.model_copy(update={
        "preferred_batch_sizes": [s for s in b.preferred_batch_sizes if s <= max_batch],
        "max_queue_delay_us": b.max_queue_delay_us if delay_us is None else delay_us,
    })
    return spec.with_model(m.model_copy(update={"max_batch_size": max_batch, "batching": batching}))


def row_from(result: dict, max_batch: int, delay_us: int, peak_mb: float) -> dict:
    o, s = result["overall"], result["server"]
    return {
        "max_batch_size": max_batch, "max_queue_delay_us": delay_us,
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
          batch_sizes=BATCH_SIZES, delays_us: list[int] | None = None, classes: list[RequestClass] | None = None,
          log: Callable[[str], None] = print) -> dict[str, Path]:
    rows = []
    delays = delays_us or [spec.model(model).batching.max_queue_delay_us]
    total = len(batch_sizes) * len(delays)
    try:
        for delay in delays:
            for b in batch_sizes:
                generate(variant(spec, model, b, delay), repo, models=[model])
                r.load(model)
                with PeakRss(r.server.proc.pid) as rss:
                    result = measure(r.endpoints, model, load, classes)
                row = row_from(result, b, delay, rss.peak_mb)
                rows.append(row)
                note = "  (generator-limited)" if row["generator_warning"] else ""
                log(f"  [{len(rows)}/{total}] max_batch {b:>2} delay {delay:>6} us: "
                    f"{row['throughput_rps']:7.1f} req/s  P95 {row['p95_ms']:7.2f} ms  "
                    f"peak RSS {row['peak_rss_mb']:.0f} MB{note}")
    finally:
        generate(spec, repo, models=[model])  # back to what the spec says
        if r.server.alive():
            r.load(model)
    m = spec.model(model)
    return write_sweep_report(rows, out_dir, slo_p95_ms=m.slo.p95_ms, memory_budget_mb=m.memory_budget_mb,
                              title=f"Batch-size sweep: {model}",
                              load=f"{load.describe()}; {load.warmup_s:g} s warm-up, {load.duration_s:g} s steady")
