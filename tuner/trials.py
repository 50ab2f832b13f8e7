"""Trials: put a set of knobs in force, measure one load against it, and never leave a bad state.

Knobs are put in force by `tuner.apply.LiveConfig` (write, reload, verify, restore the
last-known-good), the one service that changes a live server's config. On top of it, here:
- A candidate the rules refuse is recorded as refused; nothing was written.
- If tritonserver dies during a trial, the last-known-good config is written back and the server
  is restarted with it; the trial is recorded as failed and the search goes on.
- "Last-known-good" is the last config that loaded, matched what was asked, and answered a measurement.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tritonkit import interrupt
from tritonkit.errors import InputError, KitError
from tritonkit.loadtests.asyncgen import run_load
from tritonkit.loadtests.load import Load, Outcome, RequestClass
from tritonkit.loadtests.measure import send_cheapest
from tritonkit.loadtests.pa_install import PerfAnalyzerMissing
from tritonkit.loadtests.results import build_result
from tritonkit.loadtests.stalls import without_stalls
from tritonkit.serving import Running, running
from tritonkit.slo import SloBound
from tritonkit.spec import Spec
from tritonkit.stats import percentile
from tritonkit.tuner.apply import LiveConfig
from tritonkit.tuner.knobs import Knobs
from tritonkit.tuner.settings import TuneSettings


@dataclass(frozen=True)
class TrialWindow:
    """How long each measurement runs. The steady window holds about `requests` requests at the
    trial's rate, so that its P95 rests on enough of them (a P95 of 500 requests is 25 of them),
    but never less than `duration_s` nor more than `max_s` (the time budget of one trial)."""

    warmup_s: float = 0.5
    duration_s: float = 2.0
    drain_s: float = 2.0
    requests: int = 3000
    max_s: float = TuneSettings.max_trial_s
    # the client that sends a trial's load: asyncio (Python, in this process) or perf_analyzer (C++,
    # the least of the cores a server shares with its client); a load of several priority classes, or
    # one perf_analyzer gives up on at a refused request, goes through asyncio
    engine: str = TuneSettings.engine

    def window_s(self, rate: float) -> float:
        return round(min(self.max_s, max(self.duration_s, self.requests / rate)), 2)


@dataclass
class Trial:
    n: int
    phase: str
    label: str
    knobs: dict
    load: str
    rate: float | None
    requests: int = 0
    ok_rps: float = 0.0
    p50_ms: float | None = None
    p95_ms: float | None = None  # what the tuner decides on: the client's, less the generator's own stalls
    p99_ms: float | None = None
    client_p95_ms: float | None = None  # as the client saw it, stalls included
    server_ms: float | None = None  # Triton's mean request latency (statistics): queue and compute
    overhead_ms: float | None = None  # client mean minus server mean: network, gRPC, the client
    stalled_ms: float = 0.0  # how long the generator's loop did not run in the trial
    generator_limited: bool = False  # the generator, not the server, limited this trial
    offered: bool = True  # False when the generator could not send the trial's rate (nothing to judge)
    error_ratio: float = 0.0
    errors: dict = field(default_factory=dict)
    engine: str = ""  # the client that measured it
    mean_batch: float | None = None
    padding_waste: float | None = None  # padded elements over real ones, as sent (0: nothing padded)
    passed: bool = False
    seconds: float = 0.0
    note: str = ""
    batch_stats: tuple = ()  # (before, after) statistics, for the cost model; not logged
    latencies_ms: tuple = ()  # each ok request's, as p95_ms counts them: for pooling runs; not logged

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("batch_stats")
        d.pop("latencies_ms")
        return d


class LocalServer:
    """The tuner's own tritonserver (offline mode), which it can restart."""

    def __init__(self, spec: Spec, repo: Path, state_dir: Path, model: str, log: Callable[[str], None]):
        self.spec, self.repo, self.state_dir, self.model, self.log = spec, repo, state_dir, model, log
        self._stack: contextlib.ExitStack | None = None
        self.r: Running | None = None

    def start(self) -> Running:
        self._stack = contextlib.ExitStack()
        ports = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
        self.r = self._stack.enter_context(running(self.spec, self.repo, self.state_dir, models=[self.model],
                                                   ports=ports, log=self.log))
        return self.r

    @property
    def url(self) -> str:
        return self.r.endpoints.grpc

    def alive(self, grace_s: float = 0.0) -> bool:
        return self.r is not None and self.r.server.alive(grace_s)

    def restart(self) -> Running:
        self.close()
        return self.start()

    def close(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack, self.r = None, None


class Trials:
    """`server` is the tuner's own (`LocalServer`) or one it reaches through the API
    (`tuner.remote.RemoteServer`, with the `live` config that goes through it)."""

    def __init__(self, server: LocalServer, spec: Spec, repo: Path | None, model: str, *, slo: SloBound,
                 window: TrialWindow, log: Callable[[str], None],
                 input_data: Path | None = None, live: LiveConfig | None = None):
        self.server, self.spec, self.repo, self.model = server, spec, repo, model
        self.input_data = input_data  # real request data the trials send, else the model's generated inputs
        # a trial passes on the tuner's target, the SLO less its margin (`SloBound.passes`)
        self.slo, self.window, self.log = slo, window, log
        self.trials: list[Trial] = []
        # owns what is in force and what served last
        self.live = live or LiveConfig(server, spec, repo, model, log)
        self.served_name = self.live.served_name  # where the trials' load goes (a shadow copy's own name)

    # -- putting knobs in force -------------------------------------------------------------

    def apply(self, k: Knobs) -> str | None:
        """Make `k` the serving config. None when it serves; otherwise why not (and the
        last-known-good config is serving again)."""
        if k == self.live.current_knobs:
            return None
        try:
            return self.live.apply_knobs(self.spec, k)
        except InputError as e:  # the kit's own rules refuse it: nothing was written
            return f"refused by the rules: {e}"

    # -- measuring ----------------------------------------------------------------------------

    def run(self, k: Knobs, load: Load, phase: str, classes: list[RequestClass] | None = None) -> Trial:
        interrupt.check()  # a Ctrl-C a library swallowed on the way stops the search here
        t0 = time.perf_counter()
        trial = Trial(len(self.trials) + 1, phase, k.label(), k.to_json(), load.describe(), load.rate)
        refused = self.apply(k)
        if refused:
            trial.note = refused
        else:
            try:
                # run_load reads Triton's statistics at the window's edges: the cost model's input too
                classes = classes or [RequestClass()]
                out, trial.engine = self._send(load, classes)
                self._fill(trial, build_result(self.served_name, load, classes, out), out)
                trial.batch_stats = (out.stats_before or {}, out.stats_after or {})
                self.live.keep()
            except KitError as e:
                trial.note = f"measurement failed: {str(e)[:200]}"
            if not self.server.alive():
                trial.passed = False
                trial.note = "tritonserver died during the trial"
                self.log(f"    {trial.note}")
                self.live.restore()
        trial.seconds = round(time.perf_counter() - t0, 2)
        self.trials.append(trial)
        p95 = "-" if trial.p95_ms is None else f"{trial.p95_ms:.1f}"
        self.log(f"  trial {trial.n:>3} {phase:<10} {k.label()}  {load.describe():<44} {load.duration_s:4.1f} s "
                 f"{trial.ok_rps:7.0f} req/s  P95 {p95:>6} ms  err {100 * trial.error_ratio:4.1f}%  "
                 f"{'pass' if trial.passed else 'fail'}"
                 f"{f'  padding {trial.padding_waste:.2f}' if trial.padding_waste else ''}"
                 f"{'  (' + trial.note + ')' if trial.note else ''}")
        return trial

    def _send(self, load: Load, classes: list[RequestClass]) -> tuple[Outcome, str]:
        url, name = self.server.url, self.served_name
        if self.window.engine == "perf_analyzer":
            try:
                return send_cheapest(url, name, load, classes, input_data=self.input_data)
            except PerfAnalyzerMissing as e:  # e.g. a box without a package index, a server newer than the wheels
                self.log(f"    perf_analyzer cannot run here ({e}); the asyncio client measures the trials")
                self.window = replace(self.window, engine="asyncio")
        return asyncio.run(run_load(url, name, load, classes, input_data=self.input_data)), "asyncio"

    def _fill(self, t: Trial, result: dict, out: Outcome) -> None:
        o = result["overall"]
        t.requests = o["requests"]
        t.ok_rps = round(o["throughput_rps"], 1)
        # NaN percentiles (nothing succeeded) are None
        t.p50_ms, t.p99_ms, t.client_p95_ms = _round(o["p50_ms"]), _round(o["p99_ms"]), _round(o["p95_ms"])
        # The figure decided on: each request's latency less the generator's stalls while it was in
        # flight (loadtests/stalls.py), so that a hiccup of the generator does not fail a good config.
        own = without_stalls(out.samples, out.stalls)
        t.p95_ms = round(percentile(own, 95) * 1e3, 3) if own else None
        t.latencies_ms = tuple(x * 1e3 for x in own)
        t.stalled_ms = round(1e3 * sum(b - a for a, b in out.stalls), 1)
        t.server_ms = _round(result["server"].get("request_ms"))
        t.overhead_ms = _round(result["client_overhead_ms"])
        t.errors = o["errors"]
        t.error_ratio = round(sum(o["errors"].values()) / o["requests"], 4) if o["requests"] else 1.0
        t.mean_batch = result["server"].get("mean_batch")
        t.padding_waste = result["padding_waste"]
        gen = result["generator"]
        # A rate the generator failed to offer makes the trial meaningless; stalls that moved the
        # client's P95 by more than 10% are taken out, and both are said.
        short = t.rate is not None and gen["short"]
        hiccup = t.p95_ms is not None and t.client_p95_ms is not None and t.client_p95_ms > 1.1 * t.p95_ms
        t.offered = not short
        t.generator_limited = bool(short or gen["saturated"] or hiccup)
        if short:
            t.note = f"generator-limited: sent {gen['achieved_rate']:.0f} of {t.rate:.0f} req/s"
        elif t.generator_limited:
            t.note = (f"generator-limited: stalled {t.stalled_ms:.0f} ms, client P95 {t.client_p95_ms:.1f} ms "
                      f"with its stalls")
        t.passed = self.slo.passes(t.p95_ms, t.error_ratio) and not short

    def open_load(self, rate: float, share: float = 1.0) -> Load:
        """`share`: of the window a full trial has (a screening run's is shorter), never under its minimum."""
        p = self.window
        return Load(rate=rate, duration_s=max(p.duration_s, round(share * p.window_s(rate), 2)), warmup_s=p.warmup_s,
                    drain_s=p.drain_s)

    def confirm_load(self, rate: float) -> Load:
        """A confirmation run (and the start's beside it): the longest window a trial may have. Near
        saturation a queue grows slowly: a config held P95 40-69 ms in 3.7 s runs at the rate where
        10 s load tests then gave 134-375 ms, and a written claim must hold over a load test."""
        p = self.window
        return Load(rate=rate, duration_s=max(p.duration_s, p.max_s), warmup_s=p.warmup_s, drain_s=p.drain_s)

    def closed_load(self, clients: int, seconds: float | None = None) -> Load:
        p = self.window
        return Load(concurrency=clients, duration_s=seconds or p.duration_s, warmup_s=p.warmup_s, drain_s=p.drain_s)


def _round(v: float | None) -> float | None:
    return None if v is None or v != v else round(v, 3)
