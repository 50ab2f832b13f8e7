"""Load an ONNX file and check it, turning every way it can be unusable into an InputError."""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx

from tritonkit.errors import input_error
from tritonkit.onnx_io import OnnxReadError, load_checked

FIX = "point onnx: at a valid ONNX file (re-export it; `tritonkit sample-model` writes one)"


def load_model(path: Path, file: str, at: str) -> onnx.ModelProto:
    """`file`/`at` name the spec field that pointed here, so the message says what to edit."""
    path = Path(path)
    if not path.is_file():
        raise input_error(file, at, f"{path}: file not found", FIX)
    try:
        return load_checked(path)
    except OnnxReadError as e:
        raise input_error(file, at, f"{path} is not a usable ONNX model ({e})", FIX) from None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def dims(vi: onnx.ValueInfoProto) -> list[int | str]:
    """Fixed dims as ints, symbolic ones by name ('?' when unnamed). A dim_value of -1 (or 0), as
    Paddle and some TF converters write a dynamic axis, is unknown too, as in tritonkit.onnx_io."""
    out: list[int | str] = []
    for d in vi.type.tensor_type.shape.dim:
        fixed = d.HasField("dim_value") and d.dim_value > 0
        out.append(d.dim_value if fixed else (d.dim_param or "?"))
    return out
