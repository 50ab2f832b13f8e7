"""One load by NVIDIA's perf_analyzer (PA), read back into the kit's `Outcome`.

PA is the C++ client Triton users trust: on a small box it takes far less of the cores than a
Python generator. The kit drives it so that its numbers mean what the other engines' mean:
- the model's inputs come from the one sampler (the spec's rules, or the user's `--input-data`),
  written as PA's `--input-data` JSON with each sample's shape, plus `--shape` per input;
- open loop is `--request-rate-range` (Poisson or constant) with async sends; a shaped load is the
  same schedule as the asyncio engine's, given as `--request-intervals`; closed loop is
  `--concurrency-range`;
- PA runs three measurement windows that together cover the warm-up and the steady window (its
  stability check is switched off: the kit, not PA, decides what a run means);
- latencies are exact: every request's send and response times come from PA's profile export,
  and only requests sent inside the steady window count. PA 2.51 writes every request's input and
  output values into that export (66 KB a request for the sample model: gigabytes, and as much of
  PA's memory, at a few thousand requests a second), so it is read through a pipe, keeping the two
  timestamps and never touching the disk;
- tensors go over gRPC, as a production client sends them, so PA's numbers compare with the other
  engines'. Where the kit uses PA as its cheapest client (the judge, tuner trials, the serving
  bench) and the server is on this machine, `shared_memory` passes them through system shared
  memory instead, as Triton users run PA on one host: it takes less of the cores the server
  shares, and the export then records one value a tensor (a few hundred bytes a request, where
  gigabytes would pass through PA's memory at thousands of requests a second). That value is
  whatever bytes PA finds where it looks, now and then a NaN, at which PA's JSON writer stops
  without flushing its last 64 KB: the export ends early or holds nothing. The NaN is chance (2 to
  6 runs in 60), so such a run is measured once more the same way; lost twice, it raises
  `PerfAnalyzerLostExport`, and the cheapest-client path measures it with the asyncio client.
  Never again with tensors over gRPC: for a 64x64 image at 4,300 req/s that took PA to 22 GB and
  the kernel's OOM killer.
- PA runs under an address-space cap (`PA_MEMORY_SHARE` of the machine's memory): a run whose
  export outgrows it ends in PA, as `PerfAnalyzerStopped` saying so, not in the OOM killer taking
  whatever else runs.
PA gives up on a measurement at the first failed request (a full queue, a queue timeout): the run
then raises `PerfAnalyzerStopped` with Triton's own count of what it served and refused.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import resource
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from tritonkit.clients import Client
from tritonkit.clients.errors import classify
from tritonkit.errors import InputError, KitError, flag_problem
from tritonkit.loadtests import pa_install
from tritonkit.loadtests.load import Load, Outcome, RequestClass, Sample

WINDOWS = 3  # PA's stability rule needs three windows before it reports anything
WINDOW_SLEEP = 1.2  # PA sleeps 1.2 windows per measurement window
GENERATED_SAMPLES = 16  # distinct payloads where the rules vary the shape
PA_MEMORY_SHARE = 0.5  # of the machine's memory: PA's address space at most
ENV_MEMORY_MB = "TRITONKIT_PA_MEMORY_MB"  # the cap in MB instead (tests)
_PAIR = re.compile(rb'"timestamp":(\d+)|"response_timestamps":\[(\d*)')
_END = re.compile(rb'"version":"[^"]*"(,"\w+":"[^"]*")*\}\s*$')  # written after every experiment
_END_SPAN = 4096
_DELAYED = re.compile(r"([\d.]+)% of the requests were delayed")
_THREAD_ERROR = re.compile(r"Thread \[\d+\] had error: (.+)")


class PerfAnalyzerLostExport(KitError):
    """PA ran the load, yet its profile export reached the kit with no request in it (seen
    now and then, with exit code 0): the run has no latencies to give."""


@dataclass
class PerfAnalyzerStopped(KitError):
    """PA abandoned the measurement at a failed request; what Triton counted over the run."""

    message: str
    served: int
    failed: int
    kinds: dict[str, str] = field(default_factory=dict)  # kind -> PA's first message of that kind

    def __str__(self) -> str:
        return self.message


def check_classes(classes: list[RequestClass]) -> RequestClass:
    """PA sends one kind of request: no priority, no per-request timeout."""
    if len(classes) != 1 or classes[0].priority or classes[0].timeout_us is not None:
        raise InputError([flag_problem("--class", "perf_analyzer sends one class with the model's default priority "
                                                  "and timeout: drop --class, or use --engine asyncio or locust")])
    return classes[0]


def run_pa(url: str, model: str, load: Load, classes: list[RequestClass] | None = None, *,
           input_data: Path | None = None, seed: int = 0, shared_memory: bool = False, log=print) -> Outcome:
    """Send `load` to `model` at the gRPC `url` with perf_analyzer; the steady window's samples and
    Triton's statistics around it, as the other engines give them."""
    cls = check_classes(classes or [RequestClass()])
    if load.concurrency and load.shape != "constant":
        raise InputError([flag_problem("--shape", "perf_analyzer keeps a fixed concurrency: use --shape constant "
                                                  "with --users, or --rps for a shaped load")])
    with Client(url) as client:
        meta = client.metadata(model)
        pa = pa_install.find(client.server_version(), log=log)
        sampler = meta.sampler(input_data, seed)
        count = len(sampler.samples) if sampler.samples else GENERATED_SAMPLES if sampler.varies else 1
        samples = sampler.spread(count)
        with tempfile.TemporaryDirectory(prefix="tritonkit-pa-") as tmp:
            args = _arguments(model, url, load, cls, samples, sampler.batched, Path(tmp), seed)
            shm = []
            strings = any(m.datatype == "BYTES" for m in (*meta.inputs, *meta.outputs))
            if shared_memory and is_local(url) and not strings:
                shm = ["--shared-memory", "system", "--output-shared-memory-size",
                       str(_output_bytes(client, model, samples, cls.batch, sampler.batched))]
            try:
                out = _measure(pa, args + shm, client, model, load, cls, Path(tmp) / "export.fifo")
            except PerfAnalyzerLostExport as e:
                log(f"{e}; measuring the run again")
                out = _measure(pa, args + shm, client, model, load, cls, Path(tmp) / "export.fifo")
        # perf_analyzer cycles through the samples: their padding is what it sent, near enough
        out.real_elements, out.sent_elements = sampler.real_elements, sampler.sent_elements
        return out


def _arguments(model: str, url: str, load: Load, cls: RequestClass, samples: list[dict[str, np.ndarray]],
               batched: bool, tmp: Path, seed: int) -> list[str]:
    data = tmp / "input_data.json"
    data.write_text(json.dumps({"data": [sample_json(s, batched) for s in samples]}))
    window_ms = math.ceil(1000 * (load.warmup_s + load.duration_s + 0.5) / (WINDOWS * WINDOW_SLEEP))
    args = ["-m", model, "-u", url, "-i", "grpc", "--async", "-b", str(cls.batch), "--input-data", str(data),
            "--measurement-mode", "time_windows", "-p", str(window_ms), "--max-trials", str(WINDOWS),
            "--stability-percentage", "100000", "--percentile", "95", "-v",
            "--profile-export-file", str(tmp / "export.fifo")]
    for name in samples[0]:  # PA checks one --shape per input against every sample: give it where they agree
        shapes = {a[name].shape[1:] if batched else a[name].shape for a in samples}
        if len(shapes) == 1:
            args += ["--shape", f"{name}:{','.join(str(d) for d in shapes.pop()) or '1'}"]
    if load.concurrency:
        return args + ["--concurrency-range", str(load.concurrency)]
    if load.shape == "constant":
        return args + ["--request-rate-range", f"{load.rate:g}", "--request-distribution", load.arrival]
    intervals = tmp / "intervals.txt"  # the asyncio engine's schedule, in microseconds
    intervals.write_text("\n".join(str(max(1, round(g * 1e6))) for g in schedule_gaps(load, seed)) + "\n")
    return args + ["--request-intervals", str(intervals)]


def is_local(url: str) -> bool:
    host = url.rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def _output_bytes(client: Client, model: str, samples: list[dict[str, np.ndarray]], batch: int,
                  batched: bool) -> int:
    """A shared-memory region per output big enough for any response: the largest each sample's
    own answer takes, times the batch, twice over (an output whose size depends on the data)."""
    largest = 0
    for sample in {tuple((k, v.shape) for k, v in s.items()): s for s in samples}.values():
        answer = client.infer(model, sample)
        largest = max(largest, *(a.nbytes for a in answer.values()))
    return max(1 << 16, 2 * largest * (batch if batched else 1))


def schedule_gaps(load: Load, seed: int = 0) -> list[float]:
    """Gaps between arrivals over warm-up and steady window, following the load's shape."""
    rng, t, gaps = random.Random(seed), 0.0, []
    while t < load.total_s + 0.5:
        rate = load.rate_at(t)
        gap = rng.expovariate(rate) if load.arrival == "poisson" else 1.0 / rate
        gaps.append(gap)
        t += gap
    return gaps


def sample_json(arrays: dict[str, np.ndarray], batched: bool) -> dict:
    out = {}
    for name, a in arrays.items():
        one = a[0] if batched else a
        values = [v.decode() if isinstance(v, bytes) else v for v in one.reshape(-1).tolist()]
        out[name] = {"content": values, "shape": list(one.shape)}
    return out


def _measure(pa: pa_install.PerfAnalyzer, args: list[str], client: Client, model: str, load: Load,
             cls: RequestClass, fifo: Path) -> Outcome:
    fifo.unlink(missing_ok=True)  # a run measured again makes its own
    os.mkfifo(fifo)
    pairs: list[tuple[int, int | None]] = []
    export = ExportPairs(fifo)
    reader = threading.Thread(target=lambda: pairs.extend(export), daemon=True)
    reader.start()
    lines: list[str] = []
    started = threading.Event()
    cap = memory_cap()
    proc = subprocess.Popen(pa.command(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=pa.environ())
    with contextlib.suppress(OSError):  # set from outside: a preexec_fn is unsafe beside the reader thread
        resource.prlimit(proc.pid, resource.RLIMIT_AS, (cap, cap))

    def collect() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip())
            if "Using asynchronous calls" in line:
                started.set()  # the last of its settings: PA starts sending right after it

    collector = threading.Thread(target=collect, daemon=True)
    collector.start()
    out = Outcome()
    t_start = time.perf_counter()
    deadline = time.monotonic() + 60
    while not started.wait(0.1) and proc.poll() is None and time.monotonic() < deadline:
        pass
    time.sleep(load.warmup_s)
    out.stats_before = client.statistics(model)
    # PA's CPU over the steady window only: after it, PA spends a while writing its export
    cpu0 = _cpu_s(proc.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=load.duration_s)
    cpu = _cpu_s(proc.pid) - cpu0 if proc.poll() is None else None
    try:
        proc.wait(timeout=load.total_s * 3 + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    collector.join(timeout=10)
    out.wall_s = time.perf_counter() - t_start
    out.cpu_percent = 100.0 * cpu / load.duration_s if cpu is not None else 0.0
    _unblock(fifo)
    reader.join(timeout=120)
    out.stats_after = client.statistics(model)
    served, failed = _counts(out.stats_before, out.stats_after)
    errors = {}
    for line in lines:
        if m := _THREAD_ERROR.search(line):
            errors.setdefault(classify(Exception(m.group(1))).kind, m.group(1).strip())
    if proc.returncode != 0 and any("bad_alloc" in x for x in lines):
        raise PerfAnalyzerStopped(
            f"perf_analyzer ran out of its memory cap ({cap / 2**30:.1f} GB): its profile export holds every "
            f"request's tensors, more than that at this rate; with the server on this machine pass "
            f"--shared-memory, else use --engine asyncio for this load", served, failed)
    if proc.returncode != 0:
        said = "; ".join(f"{k}: {v}" for k, v in errors.items()) or next(
            (x for x in reversed(lines) if x.strip()), f"exit code {proc.returncode}")
        raise PerfAnalyzerStopped(
            f"perf_analyzer stopped the measurement ({said}); it does not go on past a failed request. After the "
            f"warm-up Triton served {served} of this model's requests and timed out {failed} (it does not count "
            f"queue-full refusals); to measure a load that is refused in part use --engine asyncio",
            served, failed, errors)
    if not pairs or not export.ended:  # its export is cut short: say what it printed rather than report a part
        said = " | ".join(x.strip() for x in lines[-6:] if x.strip())
        held = "ended early, after" if pairs else "held"
        raise PerfAnalyzerLostExport(f"perf_analyzer finished but its profile export {held} {len(pairs)} requests "
                                     f"(exit {proc.returncode}; Triton served {served} after the "
                                     f"warm-up); it said: {said[:400]}")
    _fill(out, pairs, load, cls.name, failed, next(iter(errors), "other"))
    for line in lines:
        if m := _DELAYED.search(line):
            out.generator_notes.append(f"perf_analyzer sent {m.group(1)}% of the requests later than scheduled")
    return out


def memory_cap() -> int:
    """PA's address-space cap in bytes: `PA_MEMORY_SHARE` of the machine's memory, or $TRITONKIT_PA_MEMORY_MB."""
    if os.environ.get(ENV_MEMORY_MB):
        return int(float(os.environ[ENV_MEMORY_MB]) * 2**20)
    return int(PA_MEMORY_SHARE * psutil.virtual_memory().total)


def _fill(out: Outcome, pairs: list[tuple[int, int | None]], load: Load, cls: str, failed: int, kind: str) -> None:
    """The steady window's requests as samples (times in seconds since the epoch, as PA gives them).
    Refusals PA did not record (its thread stops recording at its first error) come from Triton's
    count, so the error share is the server's."""
    if not pairs:
        return
    t0 = min(t for t, _ in pairs) / 1e9
    lo, hi = t0 + load.warmup_s, t0 + load.warmup_s + load.duration_s
    for sent_ns, done_ns in pairs:
        sent = sent_ns / 1e9
        if lo <= sent < hi:
            out.samples.append(Sample(cls, sent, sent, None if done_ns is None else (done_ns - sent_ns) / 1e9,
                                      None if done_ns is not None else kind))
    unrecorded = failed - sum(1 for s in out.samples if s.latency_s is None)
    out.samples += [Sample(cls, lo, lo, None, kind) for _ in range(max(0, unrecorded))]


def _cpu_s(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return t.user + t.system


def _counts(before: dict, after: dict) -> tuple[int, int]:
    def count(stats: dict, key: str) -> int:
        return int(stats.get("inference_stats", {}).get(key, {}).get("count", 0))

    return count(after, "success") - count(before, "success"), count(after, "fail") - count(before, "fail")


class ExportPairs:
    """(send ns, first response ns or None) per request, streamed from PA's profile export as it is
    written; `ended` once the document got to its end (its last members follow the requests)."""

    def __init__(self, fifo: Path, chunk: int = 1 << 20):
        self.fifo, self.chunk = fifo, chunk
        self.ended = False

    def __iter__(self) -> Iterator[tuple[int, int | None]]:
        pending: int | None = None
        rest = tail = b""
        with open(self.fifo, "rb") as f:  # blocks until PA opens it to write (or _unblock does)
            while True:
                block = f.read(self.chunk)
                buf = rest + block
                tail = (tail + block[-_END_SPAN:])[-_END_SPAN:]  # never a copy of the whole block
                done = 0
                for m in _PAIR.finditer(buf):
                    if block and m.end() == len(buf):
                        break  # its digits may go on in the next block
                    done = m.end()
                    if m.group(1) is not None:
                        pending = int(m.group(1))
                    elif pending is not None:
                        yield pending, int(m.group(2)) if m.group(2) else None
                        pending = None
                if not block:
                    self.ended = bool(_END.search(tail))
                    return
                rest = buf[max(done, len(buf) - 64):]  # a key cut in two lies within its last 64 bytes


def _unblock(fifo: Path) -> None:
    """Let the export reader see the end even when PA never opened the pipe (it failed early)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError:
        pass  # no reader waiting: it already finished

