"""`tritonkit inspect`: what an ONNX graph takes and gives, which dims are dynamic, what it is made of.

(Named inspect_graph, not inspect, so it never shadows the standard library's `inspect`.)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnx

from tritonkit.onnx_io import ONNX_TO_TRITON, graph_inputs
from tritonkit.spec import Spec

from .load import dims, load_model
from .plan import MIB, weight_bytes


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: list[int | str]  # symbolic dims by name

    @property
    def dynamic(self) -> list[int]:
        return [k for k, d in enumerate(self.shape) if not isinstance(d, int) or d <= 0]


@dataclass(frozen=True)
class GraphInfo:
    path: Path
    opsets: dict[str, int]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    ops: Counter
    weight_bytes: int

    @property
    def batch_axis(self) -> str:
        """How the leading dim looks to a batcher: dynamic, fixed at 1 (preparable) or fixed at N."""
        scalars = [t.name for t in self.inputs + self.outputs if not t.shape]
        if scalars:
            return f"none (rank-0 {scalars[0]!r}: serve with max_batch_size: 0)"
        leading = {t.shape[0] for t in self.inputs + self.outputs}
        if all(isinstance(d, str) for d in leading):
            return "dynamic"
        if leading == {1}:
            return "fixed at 1 (`tritonkit build` makes it dynamic)"
        return f"fixed ({', '.join(sorted(str(d) for d in leading))})"


def _info(vi: onnx.ValueInfoProto) -> TensorInfo:
    return TensorInfo(vi.name, ONNX_TO_TRITON.get(vi.type.tensor_type.elem_type, "?"), dims(vi))


def inspect_model(model: onnx.ModelProto, path: Path) -> GraphInfo:
    return GraphInfo(path, {o.domain or "ai.onnx": o.version for o in model.opset_import},
                     [_info(v) for v in graph_inputs(model)], [_info(v) for v in model.graph.output],
                     Counter(n.op_type for n in model.graph.node), weight_bytes(model))


def format_info(g: GraphInfo) -> str:
    opsets = ", ".join(f"{d} {v}" for d, v in sorted(g.opsets.items()))
    lines = [f"{g.path}", f"  opsets: {opsets}; weights {_size(g.weight_bytes)}; "
             f"{sum(g.ops.values())} nodes; batch axis {g.batch_axis}"]
    for kind, tensors in (("input", g.inputs), ("output", g.outputs)):
        for t in tensors:
            dyn = f"  dynamic dims {t.dynamic}" if t.dynamic else ""
            lines.append(f"  {kind:6} {t.name}: {t.dtype} {t.shape}{dyn}")
    lines.append("  ops: " + ", ".join(f"{op} {n}" for op, n in g.ops.most_common()))
    return "\n".join(lines)


def _size(n: int) -> str:
    if n >= MIB:
        return f"{n / MIB:.1f} MiB"
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def inspect_paths(paths: list[Path], spec: Spec | None, models: list[str] | None) -> str:
    """The given files, or else every (chosen) model of the spec; errors name the spec field."""
    targets: list[tuple[Path, str, str]] = []
    if paths:
        targets = [(p, str(p), "") for p in paths]
    else:
        chosen = [spec.model(n) for n in models] if models else spec.models
        for m in chosen:
            i = [x.name for x in spec.models].index(m.name)
            targets.append((spec.onnx_path(m), spec.shown, f"models[{i}].onnx"))
    return "\n".join(format_info(inspect_model(load_model(p, file, at), p)) for p, file, at in targets)
