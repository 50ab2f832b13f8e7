"""What an ONNX graph says about its inputs and outputs, and whether the spec agrees with it."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import onnx

from tritonkit.errors import Problem
from tritonkit.spec import ModelSpec, TensorSpec

# onnx.TensorProto.DataType -> Triton data type name
ONNX_TO_TRITON = {
    onnx.TensorProto.FLOAT: "FP32", onnx.TensorProto.FLOAT16: "FP16",
    onnx.TensorProto.BFLOAT16: "BF16", onnx.TensorProto.DOUBLE: "FP64",
    onnx.TensorProto.INT8: "INT8", onnx.TensorProto.INT16: "INT16",
    onnx.TensorProto.INT32: "INT32", onnx.TensorProto.INT64: "INT64",
    onnx.TensorProto.UINT8: "UINT8", onnx.TensorProto.UINT16: "UINT16",
    onnx.TensorProto.UINT32: "UINT32", onnx.TensorProto.UINT64: "UINT64",
    onnx.TensorProto.BOOL: "BOOL", onnx.TensorProto.STRING: "STRING",
}


@dataclass(frozen=True)
class GraphTensor:
    name: str
    dtype: str | None  # None when the ONNX type has no Triton equivalent
    shape: tuple[int, ...]  # full shape, batch axis included; -1 for symbolic/unknown dims


@dataclass(frozen=True)
class GraphIO:
    inputs: tuple[GraphTensor, ...]
    outputs: tuple[GraphTensor, ...]


class OnnxReadError(Exception):
    """An ONNX file that cannot be used; the message says why in one line."""


def _tensor(vi: onnx.ValueInfoProto) -> GraphTensor:
    tt = vi.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tt.shape.dim)
    return GraphTensor(vi.name, ONNX_TO_TRITON.get(tt.elem_type), dims)


def load_checked(path: Path, external_data: bool = True) -> onnx.ModelProto:
    """Load and check an ONNX file: the one rule for "usable", shared with `tritonkit build`.
    Raises OnnxReadError with the first line of what was wrong."""
    try:
        model = onnx.load(str(path), load_external_data=external_data)
        onnx.checker.check_model(model)
    except Exception as e:  # protobuf DecodeError, ValidationError, OSError: all mean "not usable"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OnnxReadError(first[:200]) from None
    if not model.graph.output:
        raise OnnxReadError("the graph has no outputs")
    return model


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Real inputs: old exporters also list initializers as graph inputs."""
    init = {i.name for i in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in init]


@functools.lru_cache(maxsize=16)
def _read(path: str, mtime_ns: int, size: int) -> GraphIO:
    model = load_checked(Path(path), external_data=False)  # shapes only: the weights can stay on disk
    return GraphIO(tuple(_tensor(v) for v in graph_inputs(model)), tuple(_tensor(v) for v in model.graph.output))


def read_io(path: Path) -> GraphIO:
    """Inputs and outputs of an ONNX file. Raises OnnxReadError for a missing or corrupt file."""
    path = Path(path)
    if not path.is_file():
        raise OnnxReadError("file not found")
    st = path.stat()
    return _read(str(path.resolve()), st.st_mtime_ns, st.st_size)


def per_sample(t: GraphTensor, batched: bool) -> TensorSpec:
    dims = list(t.shape[1:] if batched else t.shape)
    return TensorSpec(name=t.name, dtype=t.dtype, dims=dims)


def merged(declared: list[TensorSpec] | None, graph: tuple[GraphTensor, ...], batched: bool) -> tuple[TensorSpec, ...]:
    """A model's tensors as served: the spec's win field by field; what they leave out comes from the graph."""
    from_graph = {t.name: per_sample(t, batched) for t in graph}
    if declared is None:
        return tuple(from_graph.values())
    out = []
    for t in declared:
        g = from_graph[t.name]
        out.append(t.model_copy(update={"dtype": t.dtype or g.dtype, "dims": t.dims if t.dims is not None else g.dims}))
    return tuple(out)


def check_against_graph(file: str, at: str, model: ModelSpec, io: GraphIO) -> list[Problem]:
    """Names, dtypes and ranks in the spec must match the graph; the batch axis must be dynamic."""
    problems: list[Problem] = []
    batched = model.max_batch_size > 0
    for kind, declared, actual in (("inputs", model.inputs, io.inputs), ("outputs", model.outputs, io.outputs)):
        by_name = {t.name: t for t in actual}
        for t in actual:
            if batched and t.shape and t.shape[0] not in (-1,) and model.max_batch_size > 1:
                problems.append(Problem(
                    file, f"{at}.max_batch_size",
                    f"{model.max_batch_size} needs a dynamic batch axis, but the ONNX {kind[:-1]} "
                    f"{t.name!r} has a fixed first dim {t.shape[0]}",
                    "run `tritonkit build` first (it makes a fixed batch of 1 dynamic), re-export with a "
                    "dynamic batch axis, or set max_batch_size: 0" if t.shape[0] == 1 else
                    "re-export with a dynamic batch axis, or set max_batch_size: 0"))
                break
            if t.dtype is None:
                problems.append(Problem(file, f"{at}.onnx", f"{kind[:-1]} {t.name!r} has a type Triton cannot serve"))
        for i, spec_t in enumerate(declared or []):
            p = f"{at}.{kind}[{i}]"
            g = by_name.get(spec_t.name)
            if g is None:
                names = ", ".join(sorted(by_name)) or "(none)"
                problems.append(Problem(file, f"{p}.name", f"{spec_t.name!r} is not an {kind[:-1]} of the ONNX graph",
                                        f"use one of: {names}"))
                continue
            if spec_t.dtype and g.dtype and spec_t.dtype != g.dtype:
                problems.append(Problem(file, f"{p}.dtype", f"{spec_t.dtype} does not match the ONNX graph's {g.dtype}",
                                        f"set dtype: {g.dtype}"))
            if spec_t.dims is not None:
                graph_dims = list(g.shape[1:] if batched else g.shape)
                if len(spec_t.dims) != len(graph_dims):
                    hint = " (dims are per sample: leave out the batch axis)" if batched else ""
                    problems.append(Problem(
                        file, f"{p}.dims",
                        f"rank {len(spec_t.dims)} {spec_t.dims} does not match the ONNX graph's rank "
                        f"{len(graph_dims)} {graph_dims}{hint}",
                        f"set dims: {graph_dims}"))
                else:
                    for j, (d, gd) in enumerate(zip(spec_t.dims, graph_dims)):
                        if gd != -1 and d != gd:
                            problems.append(Problem(file, f"{p}.dims[{j}]",
                                                    f"{d} does not match the ONNX graph's fixed dim {gd}",
                                                    f"set it to {gd}"))
    return problems
