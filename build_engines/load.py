"""Load an ONNX file and check it, turning every way it can be unusable into an InputError."""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx

from tritonkit.errors import input_error

FIX = "point onnx: at a valid ONNX file (re-export it; `tritonkit sample-model` writes one)"


def load_model(path: Path, file: str, at: str) -> onnx.ModelProto:
    """`file`/`at` name the spec field that pointed here, so the message says what to edit."""
    path = Path(path)
    if not path.is_file():
        raise input_error(file, at, f"{path}: file not found", FIX)
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as e:  # DecodeError for a truncated/corrupt file, ValidationError for a broken graph
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise input_error(file, at, f"{path} is not a usable ONNX model ({first})", FIX) from None
    if not model.graph.output:
        raise input_error(file, at, f"{path}: the graph has no outputs", FIX)
    return model


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Real inputs: old exporters also list initializers as graph inputs."""
    init = {i.name for i in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in init]


def dims(vi: onnx.ValueInfoProto) -> list[int | str]:
    """Fixed dims as ints, symbolic ones by name ('?' when unnamed)."""
    out: list[int | str] = []
    for d in vi.type.tensor_type.shape.dim:
        out.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?"))
    return out
