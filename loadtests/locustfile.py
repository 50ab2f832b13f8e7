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

Locust reports each class as its own request type (the model is the name); the "Exact latency" tab
and /tritonkit/exact give nearest-rank percentiles (see exact_stats.py).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.http as httpclient
from locust import User, constant, events, task
from tritonclient.utils import np_to_triton_dtype

from tritonkit.clients.client import ModelMeta, config_from_triton, meta_from_triton
from tritonkit.clients.errors import TritonRequestError, classify
from tritonkit.loadtests.exact_stats import OVERALL, ExactRecorder, register


@dataclass(frozen=True)
class RequestClass:
    name: str
    weight: float = 1.0
    priority: int = 0  # 0 = the model's default priority
    timeout_us: int | None = None  # queue timeout; Triton only lets it shorten the policy's (allow_timeout_override)
    batch: int = 1


def parse_classes(text: str | None) -> list[RequestClass]:
    if not text:
        return [RequestClass("default")]
    items = json.loads(text)
    if not isinstance(items, list) or not items:
        raise ValueError("must be a non-empty JSON list of objects")
    known = set(RequestClass.__dataclass_fields__)
    classes = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "name" not in item:
            raise ValueError(f"[{i}] must be an object with a \"name\"")
        if unknown := set(item) - known:
            raise ValueError(f"[{i}] unknown keys {sorted(unknown)} (known: {sorted(known)})")
        c = RequestClass(**item)
        if c.weight <= 0 or c.batch < 1 or c.priority < 0 or (c.timeout_us is not None and c.timeout_us < 0):
            raise ValueError(f"[{i}] {c.name!r}: weight must be > 0, batch >= 1, priority and timeout_us >= 0")
        classes.append(c)
    names = [c.name for c in classes]
    if len(set(names)) != len(names) or OVERALL in names:
        raise ValueError(f"class names must be unique and not {OVERALL!r}: {names}")
    return classes


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
RECORDER = register(events, ExactRecorder([c.name for c in CLASSES]))


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
        if not self.host:
            raise ValueError("no host: pass --host http://HOST:PORT (Triton's HTTP endpoint)")
        url = self.host.split("://", 1)[-1].rstrip("/")  # tritonclient refuses a scheme
        self.client = httpclient.InferenceServerClient(url)
        try:
            metadata, config = self.client.get_model_metadata(MODEL), self.client.get_model_config(MODEL)
        except Exception as e:  # noqa: BLE001 - typed, so the log says "model not ready", "unavailable", ...
            raise classify(e) from e
        self.meta = meta_from_triton(MODEL, metadata, config_from_triton(config))
        check_against_model(self.meta)
        self.rng = np.random.default_rng()

    def on_stop(self) -> None:
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
        c = random.choices(CLASSES, weights=[c.weight for c in CLASSES])[0]
        inputs = self._inputs(c)  # built outside the timed span
        error: TritonRequestError | None = None
        start = time.perf_counter()
        try:
            self.client.infer(MODEL, inputs, priority=c.priority, timeout=c.timeout_us)
        except Exception as e:  # noqa: BLE001 - every failure is counted, by kind
            error = classify(e)
        latency_ms = (time.perf_counter() - start) * 1e3
        self.environment.events.request.fire(request_type=c.name, name=MODEL, response_time=latency_ms,
                                             response_length=0, exception=error, context={})
        RECORDER.record(c.name, latency_ms, error.kind if error else None)
