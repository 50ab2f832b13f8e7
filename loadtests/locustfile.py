"""Locust load test of one Triton model over HTTP, with exact per-class percentiles.

    TRITONKIT_MODEL=edge_mlp locust -f loadtests/locustfile.py --host http://127.0.0.1:8000

Configured by environment variables:
  TRITONKIT_MODEL    the model to load (required)
  TRITONKIT_CLASSES  JSON list of request classes, each {"name", "weight", "priority", "timeout_us", "batch"}
                     (only "name" is required); default one class "default" at the model's default priority
  TRITONKIT_SHAPES   JSON {input: {"min": [..], "max": [..]}}: per-sample ranges; each request draws every
                     dynamic dim uniformly within them (dynamic dims without a range are 1)
  TRITONKIT_WAIT_S   seconds each user waits between requests (default 0: closed loop, back to back)
  TRITONKIT_EXACT_OUT  file the exact snapshot is written to when the test stops
  TRITONKIT_LOAD     JSON of a `load.Load` (what `tritonkit loadtest` passes): the run follows it
                     (open loop at a rate or closed loop, a step/ramp/spike shape, warm-up, steady
                     window, drain) instead of the user count given in the UI or on the command line
  TRITONKIT_RESULT_OUT  with TRITONKIT_LOAD: file the run's result (the kit's one JSON schema) goes to

Locust reports each class as its own request type (the model is the name); the "Exact latency" tab
and /tritonkit/exact give nearest-rank percentiles (see exact_stats.py).

Open loop in Locust: each user is an arrival stream of rate/users requests per second; every arrival
runs in its own greenlet on the user's pooled HTTP client, so a slow server cannot slow the
arrivals down. An arrival that finds the pool full is dropped and counted (the generator's limit).
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import gevent
import numpy as np
import psutil
import tritonclient.http as httpclient
from gevent.pool import Group
from locust import LoadTestShape, User, constant, events, task
from locust.exception import StopUser
from tritonclient.utils import np_to_triton_dtype

from tritonkit.clients.client import ModelMeta, config_from_triton, meta_from_triton
from tritonkit.clients.errors import TritonRequestError, classify
from tritonkit.files import write_bytes_atomic
from tritonkit.loadtests.exact_stats import ExactRecorder, register
from tritonkit.loadtests.load import Load, Outcome, RequestClass, Sample, parse_classes
from tritonkit.loadtests.results import build_result


def parse_shapes(text: str | None) -> dict[str, tuple[list[int], list[int]]]:
    shapes = {}
    for name, r in (json.loads(text) if text else {}).items():
        lo, hi = list(r["min"]), list(r["max"])
        if len(lo) != len(hi) or any(a < 1 or a > b for a, b in zip(lo, hi)):
            raise ValueError(f"{name}: min and max need equal lengths with 1 <= min <= max, got {lo} and {hi}")
        shapes[name] = (lo, hi)
    return shapes


def _from_env(var: str, parse: Callable[[str | None], Any]) -> Any:
    try:
        return parse(os.environ.get(var))
    except (ValueError, TypeError, KeyError) as e:  # bad JSON, a wrong type or a missing key
        sys.exit(f"locustfile: {var}: {e}")


MODEL = os.environ.get("TRITONKIT_MODEL", "")
if not MODEL:
    sys.exit("locustfile: TRITONKIT_MODEL is required: the name of the model to load")
CLASSES: list[RequestClass] = _from_env("TRITONKIT_CLASSES", parse_classes)
SHAPES: dict[str, tuple[list[int], list[int]]] = _from_env("TRITONKIT_SHAPES", parse_shapes)
WAIT_S: float = _from_env("TRITONKIT_WAIT_S", lambda s: float(s or 0))
LOAD: Load | None = _from_env("TRITONKIT_LOAD", lambda s: Load.from_json(s) if s else None)
RECORDER = register(events, ExactRecorder([c.name for c in CLASSES]))
POOL = 256  # connections per open-loop user: the most requests one arrival stream keeps in flight
# Open loop: one user per arrival stream; with a rate, the load's `concurrency` names how many.
STREAMS = (LOAD.concurrency or max(1, math.ceil(LOAD.rate / 200))) if LOAD and LOAD.rate else 0


class Run:
    """The measurement of a TRITONKIT_LOAD run: its clock, its window, and what it recorded."""

    start = 0.0
    outcome = Outcome()
    cpu_at_window = 0.0

    @classmethod
    def elapsed(cls) -> float:
        return time.perf_counter() - cls.start

    @classmethod
    def in_window(cls, t: float) -> bool:
        return LOAD is not None and cls.start + LOAD.warmup_s <= t < cls.start + LOAD.total_s


def _statistics(host: str) -> dict:
    with _client(host) as c:
        return c.get_inference_statistics(MODEL)["model_stats"][0]


def _client(host: str, concurrency: int = 1) -> httpclient.InferenceServerClient:
    if not host:
        raise ValueError("no host: pass --host http://HOST:PORT (Triton's HTTP endpoint)")
    return httpclient.InferenceServerClient(host.split("://", 1)[-1].rstrip("/"),  # it refuses a scheme
                                            concurrency=concurrency)


def _cpu_s() -> float:
    return sum(psutil.Process().cpu_times()[:2])


if LOAD is not None:
    @events.test_start.add_listener
    def _start_clock(environment: Any, **_kw: Any) -> None:
        Run.start, Run.outcome = time.perf_counter(), Outcome()

        def open_window() -> None:  # Triton's counters and our CPU from the start of the steady window
            gevent.sleep(LOAD.warmup_s)
            Run.outcome.stats_before, Run.cpu_at_window = _statistics(environment.host), _cpu_s()

        gevent.spawn(open_window)

    @events.test_stop.add_listener
    def _write_result(environment: Any, **_kw: Any) -> None:
        out = Run.outcome
        out.wall_s = Run.elapsed()
        busy_s = max(Run.elapsed() - LOAD.warmup_s, 1e-9)
        out.cpu_percent = 100.0 * (_cpu_s() - Run.cpu_at_window) / busy_s
        out.stats_after = _statistics(environment.host)
        result = build_result(MODEL, LOAD, CLASSES, out, engine="locust")
        if path := os.environ.get("TRITONKIT_RESULT_OUT"):
            write_bytes_atomic(path, json.dumps(result, indent=2, default=str).encode())

    class TritonShape(LoadTestShape):
        """Users over time: arrival streams (open loop, fixed) or clients following the shape."""

        def tick(self) -> tuple[int, float] | None:
            t = self.get_run_time()
            if t >= LOAD.total_s:
                return None
            users = STREAMS if LOAD.rate else LOAD.clients_at(t)
            return users, 1000.0  # spawn at once: the shape, not the spawn rate, sets the load


def check_against_model(meta: ModelMeta) -> None:
    """Fail at user start, naming the setting, rather than with one error per request."""
    for c in CLASSES:
        if meta.max_batch_size > 0 and c.batch > meta.max_batch_size:
            raise ValueError(f"TRITONKIT_CLASSES: {c.name!r} batch {c.batch} is above the model's "
                             f"max_batch_size {meta.max_batch_size}")
    per_sample = {t.name: t.shape[1:] if meta.max_batch_size > 0 else t.shape for t in meta.inputs}
    for name, (lo, _hi) in SHAPES.items():
        if name not in per_sample:
            raise ValueError(f"TRITONKIT_SHAPES: {name!r} is not an input of {meta.name} ({sorted(per_sample)})")
        if len(lo) != len(per_sample[name]):
            raise ValueError(f"TRITONKIT_SHAPES: {name!r} has {len(per_sample[name])} per-sample dims, "
                             f"the range gives {len(lo)}")


class TritonUser(User):
    """One tritonclient HTTP client per user; geventhttpclient underneath, so users share one loop."""

    wait_time = constant(WAIT_S)
    client: httpclient.InferenceServerClient | None = None

    def on_start(self) -> None:
        open_loop = LOAD is not None and LOAD.rate
        self.client = _client(self.host, concurrency=POOL if open_loop else 1)
        try:
            metadata, config = self.client.get_model_metadata(MODEL), self.client.get_model_config(MODEL)
        except Exception as e:  # noqa: BLE001 - typed, so the log says "model not ready", "unavailable", ...
            raise classify(e) from e
        self.meta = meta_from_triton(MODEL, metadata, config_from_triton(config))
        check_against_model(self.meta)
        self.rng = np.random.default_rng()
        self.in_flight = Group()

    def on_stop(self) -> None:
        # the drain: the window's requests finish before the client closes under them
        self.in_flight.join(timeout=LOAD.drain_s if LOAD else 0)
        self.in_flight.kill()
        if self.client is not None:
            self.client.close()

    def _inputs(self, c: RequestClass) -> list[httpclient.InferInput]:
        dims = {name: [int(self.rng.integers(a, b + 1)) for a, b in zip(lo, hi)] for name, (lo, hi) in SHAPES.items()}
        inputs = []
        for name, array in self.meta.random_inputs(c.batch, self.rng, dims).items():
            t = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            t.set_data_from_numpy(array)
            inputs.append(t)
        return inputs

    @task
    def infer(self) -> None:
        if LOAD is None:  # the web UI's or the command line's user count, back to back
            self._request(time.perf_counter())
        elif LOAD.rate:
            self._arrivals()
        else:
            if time.perf_counter() >= Run.start + LOAD.total_s:
                raise StopUser()
            self._request(time.perf_counter())

    def _arrivals(self) -> None:
        """Open loop: this user's share of the target rate, one greenlet per arrival."""
        rng = random.Random()
        t = time.perf_counter()
        while (t - Run.start) < LOAD.total_s:
            rate = LOAD.rate_at(t - Run.start) / STREAMS
            t += rng.expovariate(rate) if LOAD.arrival == "poisson" else 1.0 / rate
            gevent.sleep(max(0.0, t - time.perf_counter()))
            if len(self.in_flight) >= POOL:
                Run.outcome.dropped += Run.in_window(t)
                continue
            self.in_flight.spawn(self._request, t)
        self.in_flight.join(timeout=LOAD.drain_s)
        raise StopUser()

    def _request(self, scheduled: float) -> None:
        c = random.choices(CLASSES, weights=[c.weight for c in CLASSES])[0]
        inputs = self._inputs(c)  # built outside the timed span
        error: TritonRequestError | None = None
        start = time.perf_counter()
        try:
            self.client.infer(MODEL, inputs, priority=c.priority, timeout=c.timeout_us)
        except Exception as e:  # noqa: BLE001 - every failure is counted, by kind
            error = classify(e)
        latency_s = time.perf_counter() - start
        self.environment.events.request.fire(request_type=c.name, name=MODEL, response_time=latency_s * 1e3,
                                             response_length=0, exception=error, context={})
        RECORDER.record(c.name, latency_s * 1e3, error.kind if error else None)
        if Run.in_window(scheduled):
            Run.outcome.samples.append(Sample(c.name, scheduled, start, None if error else latency_s,
                                              error.kind if error else None))
            if error:
                Run.outcome.error_examples.setdefault(error.kind, str(error)[:200])
