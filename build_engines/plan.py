"""Profile planning: per-input min/opt/max shapes and a memory-bounded max batch.

This module owns the max-batch rule. `configs` asks it for `max_batch_size`, the engine is built
with its profiles, so the two can never disagree:

    max_batch = min(spec max_batch_size, memory bound)
    memory bound: the largest B with  instances * (weights + safety * activations(B)) <= budget

Activations are the peak of live tensors along the graph at batch B and the max per-sample
shapes (ONNX shape inference, then a liveness walk), so dynamic shapes are sized for the largest
shape, not the mean (ARCHITECTURE.md). On a GPU the engine build refines this with TensorRT's own
device-memory figure (see build.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx
from onnx import helper

from tritonkit.errors import InputError, Problem
from tritonkit.onnx_io import ONNX_TO_TRITON, graph_inputs
from tritonkit.spec import ModelSpec, Spec

from .load import dims, load_model

MIB = 1 << 20
SMALL_INIT_BYTES = 1024  # initializers at or below this keep their values (Reshape shapes and the like)


@dataclass(frozen=True)
class InputRange:
    name: str
    min: tuple[int, ...]  # full shapes, batch axis first when the model is batched
    opt: tuple[int, ...]
    max: tuple[int, ...]


@dataclass(frozen=True)
class Memory:
    weight_bytes: int
    activation_bytes: int  # at the planned max batch and max shapes, before the safety factor
    safety_factor: float
    instances: int
    budget_bytes: int | None
    bound: int | None  # the largest batch the budget allows (None: no budget, or no batch axis)

    @property
    def total_bytes(self) -> int:
        return int(self.instances * (self.weight_bytes + self.safety_factor * self.activation_bytes))


@dataclass(frozen=True)
class Plan:
    model: str
    batched: bool
    spec_max_batch: int
    max_batch: int  # what config.pbtxt's max_batch_size and the engine profiles' batch max say
    opt_batch: int
    dtypes: dict[str, str]
    profiles: tuple[tuple[InputRange, ...], ...]
    memory: Memory
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def bounded_by(self) -> str:
        return "memory" if self.batched and self.max_batch < self.spec_max_batch else "spec"

    def shape_points(self) -> Iterator[tuple[int, str, dict[str, tuple[int, ...]]]]:
        """(index, label, input shapes) for each profile's min, opt and max; repeats skipped."""
        seen: set[tuple] = set()
        i = 0
        for p, ranges in enumerate(self.profiles):
            for point in ("min", "opt", "max"):
                shapes = {r.name: getattr(r, point) for r in ranges}
                key = tuple(sorted(shapes.items()))
                if key in seen:
                    continue
                seen.add(key)
                label = f"{point}" if len(self.profiles) == 1 else f"profile {p} {point}"
                yield i, label, shapes
                i += 1

    def batch_of(self, shapes: dict[str, tuple[int, ...]]) -> int:
        return next(iter(shapes.values()))[0] if self.batched else 1

    def to_json(self) -> dict:
        d = asdict(self)
        d["profiles"] = [{r.name: {"min": list(r.min), "opt": list(r.opt), "max": list(r.max)} for r in ranges}
                         for ranges in self.profiles]
        d["bounded_by"] = self.bounded_by
        return d


def model_at(spec: Spec, m: ModelSpec) -> str:
    return f"models[{[x.name for x in spec.models].index(m.name)}]"


def make_plan(spec: Spec, m: ModelSpec, model: onnx.ModelProto, cap: int | None = None) -> Plan:
    """Plan for `model`, which must already take a dynamic batch (the prepared graph, or an original
    exported that way). `cap`: a lower max batch found by measuring (TensorRT's device memory).
    Raises one InputError listing every problem."""
    file, at = spec.shown, model_at(spec, m)
    batched = m.max_batch_size > 0
    inputs = graph_inputs(model)
    dtypes = {vi.name: ONNX_TO_TRITON.get(vi.type.tensor_type.elem_type, "FP32") for vi in inputs}
    problems: list[Problem] = []
    per_sample = _per_sample_ranges(file, at, m, inputs, batched, problems)
    buckets = _bucket_ranges(file, at, m, per_sample, problems)
    if problems:
        raise InputError(problems)

    notes: list[str] = []
    memory = _memory(file, at, m, model, per_sample, batched)
    max_batch = min(m.max_batch_size, memory.bound) if batched and memory.bound is not None else m.max_batch_size
    if batched and cap is not None and cap < max_batch:
        max_batch = cap
        notes.append(f"max batch capped at {cap} by TensorRT's device memory for the profile")
    opt_batch = _opt_batch(file, at, m, max_batch, notes) if batched else 0
    if batched and memory.bound is not None and memory.bound < m.max_batch_size:
        notes.append(f"max batch lowered from {m.max_batch_size} to {memory.bound} by memory_budget_mb "
                     f"{m.memory_budget_mb:g}")

    profiles = []
    for bucket in buckets:
        ranges = []
        for name, (lo, mid, hi) in bucket.items():
            if batched:
                lo, mid, hi = (1, *lo), (opt_batch, *mid), (max_batch, *hi)
            ranges.append(InputRange(name, tuple(lo), tuple(mid), tuple(hi)))
        profiles.append(tuple(ranges))
    return Plan(m.name, batched, m.max_batch_size, max_batch, opt_batch, dtypes, tuple(profiles), memory,
                tuple(notes))


Range = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def _per_sample_ranges(file: str, at: str, m: ModelSpec, inputs: list[onnx.ValueInfoProto], batched: bool,
                       problems: list[Problem]) -> dict[str, Range]:
    """Fixed dims from the graph (or the spec's dims); dynamic dims from the spec's min/opt/max,
    rounded up to a multiple of the tensor's `stride` when it has one."""
    declared = {t.name: (j, t) for j, t in enumerate(m.inputs or [])}
    out: dict[str, Range] = {}
    for vi in inputs:
        graph_dims = dims(vi)[1:] if batched else dims(vi)
        j, t = declared.get(vi.name, (None, None))
        where = f"{at}.inputs[{j}]" if j is not None else f"{at}.inputs"
        lo, mid, hi = [], [], []
        for k, gd in enumerate(graph_dims):
            fixed = gd if isinstance(gd, int) and gd > 0 else None
            if t is not None and t.dims is not None and k < len(t.dims) and t.dims[k] > 0:
                fixed = t.dims[k]
            if fixed is not None:
                lo.append(fixed)
                mid.append(fixed)
                hi.append(fixed)
                continue
            given = [getattr(t, key) if t is not None else None for key in ("min", "opt", "max")]
            if any(g is None or k >= len(g) for g in given):
                shown = [d if isinstance(d, int) and d > 0 else -1 for d in graph_dims]
                problems.append(Problem(
                    file, f"{where}.max" if t is not None else where,
                    f"input {vi.name!r} dim {k} is dynamic, so its min/opt/max are needed for the engine "
                    "profile and the memory bound",
                    f"give min, opt and max for {vi.name!r} (per sample, e.g. dims: {shown}, "
                    "and min/opt/max of the same rank)"))
                break
            # A stride-bound dim (H/W of a detector) runs only at multiples of the stride.
            lo.append(_up(given[0][k], t.stride))
            mid.append(_up(given[1][k], t.stride))
            hi.append(_up(given[2][k], t.stride))
        else:
            out[vi.name] = (tuple(lo), tuple(mid), tuple(hi))
    return out


def _up(value: int, stride: int | None) -> int:
    """`value` rounded up to a multiple of `stride` (unchanged without one)."""
    return -(-value // stride) * stride if stride else value


def _strides(m: ModelSpec) -> dict[str, int | None]:
    return {t.name: t.stride for t in m.inputs or []}


def _dynamic_dims(per_sample: dict[str, Range]) -> list[tuple[str, int]]:
    return [(n, k) for n, (lo, _, hi) in per_sample.items() for k in range(len(lo)) if lo[k] != hi[k]]


def _bucket_ranges(file: str, at: str, m: ModelSpec, per_sample: dict[str, Range],
                   problems: list[Problem]) -> list[dict[str, Range]]:
    """One profile per length bucket: every dynamic dim is cut at the same edges (ids, mask and
    type ids of one sequence share its length)."""
    edges = m.build.bucket_edges
    if not edges:
        return [per_sample]
    where = f"{at}.build.bucket_edges"
    dyn = _dynamic_dims(per_sample)
    if not dyn:
        problems.append(Problem(file, where, "set, but no input has a dynamic dim to bucket",
                                "remove bucket_edges"))
        return [per_sample]
    for k, e in enumerate(edges):
        if k and e <= edges[k - 1]:
            problems.append(Problem(file, f"{where}[{k}]", f"{e} is not above the previous edge {edges[k - 1]}",
                                    "list the edges in increasing order"))
        for name, d in dyn:
            lo, hi = per_sample[name][0][d], per_sample[name][2][d]
            if not lo <= e < hi:
                problems.append(Problem(file, f"{where}[{k}]",
                                        f"{e} is outside input {name!r} dim {d}'s range {lo}..{hi - 1}",
                                        f"use edges from {lo} to {hi - 1}"))
    if problems:
        return [per_sample]
    strides = _strides(m)
    buckets = []
    bounds = [0, *edges]
    for k, low_edge in enumerate(bounds):
        high_edge = edges[k] if k < len(edges) else None
        bucket = {}
        for name, (lo, mid, hi) in per_sample.items():
            blo, bmid, bhi = list(lo), list(mid), list(hi)
            for n, d in dyn:
                if n != name:
                    continue
                stride = strides.get(name)
                blo[d] = _up(max(lo[d], low_edge + 1), stride)
                bhi[d] = hi[d] if high_edge is None else _up(min(hi[d], high_edge), stride)
                # The spec's opt if it falls in this bucket, else the bucket's top (what it pads to).
                bmid[d] = mid[d] if blo[d] <= mid[d] <= bhi[d] else bhi[d]
            bucket[name] = (tuple(blo), tuple(bmid), tuple(bhi))
        buckets.append(bucket)
    return buckets


def _opt_batch(file: str, at: str, m: ModelSpec, max_batch: int, notes: list[str]) -> int:
    if m.build.opt_batch is not None:
        if m.build.opt_batch > m.max_batch_size:
            raise InputError([Problem(file, f"{at}.build.opt_batch",
                                      f"{m.build.opt_batch} is above max_batch_size {m.max_batch_size}",
                                      f"use 1 to {m.max_batch_size}")])
        want, why = m.build.opt_batch, "build.opt_batch"
    elif m.batching.preferred_batch_sizes:
        want, why = max(m.batching.preferred_batch_sizes), "the largest preferred batch size"
    else:
        want, why = max_batch, "the max batch"
    if want > max_batch:
        notes.append(f"opt batch {want} ({why}) lowered to the max batch {max_batch}")
    return min(want, max_batch)


# ---- memory --------------------------------------------------------------------------------------

def _itemsize(elem_type: int) -> int:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except Exception:  # STRING and other types without a fixed width
        return 0


def weight_bytes(model: onnx.ModelProto) -> int:
    """Initializers and Constant-node tensors, in the graph and in every subgraph (If branches,
    Loop and Scan bodies carry weights of their own)."""
    return _graph_weight_bytes(model.graph)


def _tensor_bytes(t: onnx.TensorProto) -> int:
    return int(np.prod(t.dims, dtype=np.int64)) * _itemsize(t.data_type)


def _graph_weight_bytes(graph: onnx.GraphProto) -> int:
    total = sum(_tensor_bytes(t) for t in graph.initializer)
    total += sum(_tensor_bytes(t.values) for t in graph.sparse_initializer)
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and node.op_type == "Constant":
                total += _tensor_bytes(a.t)
            elif a.type == onnx.AttributeProto.GRAPH:
                total += _graph_weight_bytes(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                total += sum(_graph_weight_bytes(g) for g in a.graphs)
    return total


def _light(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph without large weight values: shape inference needs their shapes, not their bytes."""
    light = onnx.ModelProto(ir_version=model.ir_version)
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    g = light.graph
    g.name = model.graph.name
    g.node.extend(model.graph.node)
    g.output.extend(model.graph.output)
    g.input.extend(graph_inputs(model))
    for t in model.graph.initializer:
        if len(t.raw_data) > SMALL_INIT_BYTES or int(np.prod(t.dims, dtype=np.int64)) * 8 > SMALL_INIT_BYTES:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            g.initializer.append(t)
    return light


def activation_bytes(light: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> int:
    """Peak bytes of live activations (inputs included, weights not) for one run at `shapes`."""
    m = onnx.ModelProto()
    m.CopyFrom(light)  # light: no big weights, so this copy is cheap
    for vi in m.graph.input:
        if vi.name in shapes:
            del vi.type.tensor_type.shape.dim[:]
            for d in shapes[vi.name]:
                vi.type.tensor_type.shape.dim.add().dim_value = int(d)
    for vi in m.graph.output:  # a -1 written as an output's batch axis would stand in for the inferred size
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value <= 0:
                d.Clear()
    inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
    g = inferred.graph
    size: dict[str, int] = {}
    for vi in [*g.value_info, *g.output, *(v for v in g.input if v.name in shapes)]:
        tt = vi.type.tensor_type
        if tt.shape.dim and all(d.HasField("dim_value") and d.dim_value > 0 for d in tt.shape.dim):
            size[vi.name] = int(np.prod([d.dim_value for d in tt.shape.dim], dtype=np.int64)) * _itemsize(tt.elem_type)
        elif vi.type.HasField("tensor_type") and not tt.shape.dim and tt.HasField("shape"):
            size[vi.name] = _itemsize(tt.elem_type)  # a scalar
        # unknown (data-dependent) sizes are not counted; the safety factor is for such slack
    nodes = list(g.node)
    last_use = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            last_use[name] = i
    for o in g.output:
        last_use[o.name] = len(nodes)
    live = sum(size.get(n, 0) for n in shapes)
    peak = live
    for i, node in enumerate(nodes):
        live += sum(size.get(o, 0) for o in node.output)
        peak = max(peak, live)
        for name in set(node.input):
            if last_use.get(name) == i:
                live -= size.get(name, 0)
    return peak


def _memory(file: str, at: str, m: ModelSpec, model: onnx.ModelProto, per_sample: dict[str, Range],
            batched: bool) -> Memory:
    sf, inst = m.build.safety_factor, m.instances.count
    budget = int(m.memory_budget_mb * MIB) if m.memory_budget_mb else None
    weights = weight_bytes(model)
    light = _light(model)

    def act(b: int) -> int:
        return activation_bytes(light, {n: ((b, *hi) if batched else hi) for n, (_, _, hi) in per_sample.items()})

    def fits(b: int) -> bool:
        return inst * (weights + sf * act(b)) <= budget

    if budget is None:
        return Memory(weights, act(m.max_batch_size if batched else 1), sf, inst, None, None)
    if not fits(1):
        need = inst * (weights + sf * act(1))
        raise InputError([Problem(
            file, f"{at}.memory_budget_mb",
            f"{m.memory_budget_mb:g} MiB is too small{' even for batch 1' if batched else ''}: {inst} instance(s) x "
            f"({weights / MIB:.1f} MiB weights + {sf:g} x {act(1) / MIB:.1f} MiB activations) = {need / MIB:.1f} MiB",
            f"raise memory_budget_mb to at least {math.ceil(need / MIB * 100) / 100:g}, or lower "
            "instances.count or the max shapes")])
    if not batched:
        return Memory(weights, act(1), sf, inst, budget, None)
    # Peak activations grow with B (each live set is linear in B), so bisect for the largest fit.
    lo, hi = 1, m.max_batch_size
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return Memory(weights, act(lo), sf, inst, budget, lo)


def serving_max_batch(spec: Spec, m: ModelSpec, onnx_path=None) -> int:
    """The max batch `configs` writes. Without a memory budget it is the spec's value and no graph
    is read; with one, the plan's memory bound applies."""
    if m.max_batch_size == 0 or m.memory_budget_mb is None:
        return m.max_batch_size
    path = onnx_path or spec.onnx_path(m)
    model = load_model(path, spec.shown, f"{model_at(spec, m)}.onnx")
    return make_plan(spec, m, model).max_batch
