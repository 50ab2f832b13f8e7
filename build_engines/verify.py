"""Check a prepared graph (or an engine's outputs) against ONNX Runtime on the original model.

Random inputs at each profile's min, opt and max shapes. When the original had a fixed batch of 1,
the reference for a batch of B is B separate batch-1 runs of the original, stacked: that is what
"the batch axis was made dynamic without changing the math" means.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort

from tritonkit.input_rules import InputRule
from tritonkit.inputs import draw

from .plan import Plan

NP_DTYPES = {
    "FP32": np.float32, "FP16": np.float16, "FP64": np.float64, "BOOL": np.bool_,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
}


@dataclass(frozen=True)
class Check:
    label: str  # "profile 0 max"
    shapes: dict[str, tuple[int, ...]]
    max_abs: float
    max_rel: float
    worst_output: str
    passed: bool


class VerifyError(Exception):
    """A run failed outright (ONNX Runtime refused a shape): the graph does not take that range."""


def rules_of(m) -> dict[str, InputRule]:
    """The spec's value rules for a model's inputs (a ModelSpec's `inputs`), by name."""
    return {t.name: InputRule(t.name, t.dtype or "FP32", tuple(t.dims or ()), values=t.values, value=t.value)
            for t in m.inputs or ()}


def random_feed(shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str], seed: int,
                rules: dict[str, InputRule] | None = None) -> dict[str, np.ndarray]:
    """Inputs for one shape point: an input the spec gives a `value` or `values` is drawn by the
    one sampler's rule (tritonkit/inputs.py), as every request is; the others at random."""
    rng = np.random.default_rng(seed)
    feed = {}
    for name, shape in shapes.items():
        dt = np.dtype(NP_DTYPES[dtypes[name]])
        rule = (rules or {}).get(name)
        if rule is not None and (rule.value is not None or rule.values is not None):
            feed[name] = draw(rule, shape, rng).astype(dt)
        elif dt.kind == "f":
            feed[name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind == "b":
            feed[name] = rng.integers(0, 2, shape).astype(dt)
        else:  # ids and masks: small values stay valid indices for any table with two or more rows
            feed[name] = rng.integers(0, 2, shape).astype(dt)
    return feed


def session(model: onnx.ModelProto | bytes) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1  # the kit shares small machines; the check is about values, not speed
    opts.log_severity_level = 4  # a failed run is raised as a VerifyError with its message; no log line too
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def run(sess: ort.InferenceSession, feed: dict[str, np.ndarray], what: str) -> dict[str, np.ndarray]:
    try:
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, feed)))
    except Exception as e:
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in feed.items())
        raise VerifyError(f"{what} fails at {shapes}: {str(e).strip().splitlines()[-1][:200]}") from None


def compare(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray], atol: float, rtol: float):
    """(max_abs, max_rel, worst output, passed). Pass is elementwise |a-e| <= atol + rtol*|e|."""
    max_abs = max_rel = 0.0
    worst, passed = "", True
    for name, e in expected.items():
        a = actual.get(name)
        if a is None or a.shape != e.shape:
            return float("inf"), float("inf"), name, False
        a64, e64 = a.astype(np.float64), e.astype(np.float64)
        diff = np.abs(a64 - e64)
        diff[np.isnan(a64) & np.isnan(e64)] = 0.0  # NaN where the reference has NaN is a match
        diff = np.nan_to_num(diff, nan=np.inf)
        if diff.size:
            d = float(diff.max())
            # Relative error only where the reference is above atol: near zero it says nothing.
            big = np.abs(e64) > atol
            rel = float(np.max(diff[big] / np.abs(e64[big]))) if big.any() else 0.0
            if d > max_abs:
                max_abs, worst = d, name
            max_rel = max(max_rel, rel)
            if not bool(np.all(diff <= atol + rtol * np.abs(e64))):
                passed = False
    return max_abs, max_rel, worst or next(iter(expected), ""), passed


def verify_prepared(original: onnx.ModelProto, prepared: onnx.ModelProto, plan: Plan, static_batch: bool,
                    atol: float, rtol: float, seed: int = 0, rules: dict[str, InputRule] | None = None) -> list[Check]:
    """Every profile's min/opt/max, prepared vs original. Raises VerifyError when a run fails."""
    ref, new = session(original), session(prepared)
    checks = []
    for i, label, shapes in plan.shape_points():
        feed = random_feed(shapes, plan.dtypes, seed + i, rules)
        got = run(new, feed, "the prepared graph")
        if static_batch:
            rows = [run(ref, {k: v[b:b + 1] for k, v in feed.items()}, "the original graph")
                    for b in range(plan.batch_of(shapes))]
            want = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
        else:
            want = run(ref, feed, "the original graph")
        checks.append(Check(label, shapes, *compare(got, want, atol, rtol)))
    return checks


def summary(checks: list[Check]) -> str:
    worst_abs = max(c.max_abs for c in checks)
    worst_rel = max(c.max_rel for c in checks)
    return f"max abs error {worst_abs:.2e}, max rel error {worst_rel:.2e} over {len(checks)} shape(s)"
