"""The rule for one input of a served model: its per-sample dims and the shapes and values that
requests may carry (tritonkit/inputs.py says where the rules come from and how they are used).

It is the one place that decides whether a request's shape may be served, for the kit and for the
python-backend runner alike: `tritonkit configs` copies this file beside the runner, so it needs
nothing but numpy.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import numpy as np

PARAMETER = "tritonkit_inputs"  # config.pbtxt parameter that carries the rules as JSON
# and the outputs padding changes, for clients that pad (`padding.crop`): name -> [dim, per]
CROP_PARAMETER = "tritonkit_crop"

NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
         "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
         "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_, "STRING": np.object_}


@dataclass(frozen=True)
class InputRule:
    """One input as requests must send it. `dims` are per sample, -1 for a dynamic dim, () for a
    scalar (sent as [1]: Triton needs a dim, the config reshapes it back to rank 0)."""

    name: str
    dtype: str  # Triton's data type name without TYPE_ (FP32, INT64, BOOL, ...)
    dims: tuple[int, ...]
    min: tuple[int, ...] | None = None
    opt: tuple[int, ...] | None = None
    max: tuple[int, ...] | None = None
    stride: int | None = None
    shapes: tuple[tuple[int, ...], ...] | None = None
    values: tuple[float, float] | None = None
    value: float | None = None
    # ("uniform" | "loguniform", low, high) or ("histogram", ((length, weight), ...))
    lengths: tuple | None = None
    pad_to: tuple[int, ...] | None = None  # the lengths a request is padded up to (bucket edges, the max)
    pad_value: float | None = None

    @property
    def numpy_dtype(self) -> type:
        return NUMPY.get(self.dtype, np.object_)

    def default_shape(self) -> tuple[int, ...]:
        """The shape a generated request has when nothing else is asked: `opt`, else `min`, else 1
        for each dynamic dim; rounded up to the stride."""
        ref = self.opt or self.min
        shape = tuple(d if d != -1 else (ref[j] if ref else 1) for j, d in enumerate(self.dims))
        return self.on_stride(shape)

    def on_stride(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if not self.stride:
            return shape
        s = self.stride
        return tuple(n if d != -1 else max(s, math.ceil(n / s) * s) for d, n in zip(self.dims, shape))

    def padded_length(self, n: int) -> int:
        """The length a request of length `n` is sent at: the smallest of `pad_to` that holds it."""
        if not self.pad_to:
            return n
        return min((e for e in self.pad_to if e >= n), default=n)

    def out_of_range(self, shape: tuple[int, ...]) -> str | None:
        """Why a per-sample shape may not be served (None when it may)."""
        if len(shape) != len(self.dims):
            return f"rank {len(shape)} {list(shape)}, expected {len(self.dims)} {list(self.dims)}"
        for j, n in enumerate(shape):
            if self.dims[j] != -1 and n != self.dims[j]:
                return f"dim {j} is {n}, the model takes {self.dims[j]}"
            span = f"shape range {list(self.min or self.dims)}..{list(self.max or self.dims)}"
            if self.min and n < self.min[j]:
                return f"dim {j} is {n}, below the minimum {self.min[j]} ({span})"
            if self.max and n > self.max[j]:
                return f"dim {j} is {n}, above the maximum {self.max[j]} ({span})"
            if self.stride and self.dims[j] == -1 and n % self.stride:
                return f"dim {j} is {n}, not a multiple of the stride {self.stride}"
        return None

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, d: dict) -> InputRule:
        t = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        if t.get("shapes") is not None:
            t["shapes"] = tuple(tuple(s) for s in d["shapes"])
        if t.get("lengths") is not None and d["lengths"][0] == "histogram":
            t["lengths"] = ("histogram", tuple(tuple(b) for b in d["lengths"][1]))
        return cls(**t)


def rules_parameter(rules: list[InputRule]) -> str:
    return json.dumps([r.to_json() for r in rules], separators=(",", ":"))


def edges_text(edges: tuple[int, ...] | list[int]) -> str:
    """Bucket edges as reports show them: the last bucket pads to the max."""
    return "/".join([*map(str, edges), "max"])
