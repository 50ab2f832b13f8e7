"""Requests padded up to their length bucket where they are made, and their outputs cut back.

Triton's dynamic batcher batches only requests of one shape, so traffic whose lengths vary forms
batches of one. Padded up to the next of a few lengths (the model's bucket edges and its max, the
`pad_to` of its input rules), requests share shapes and batch. An output whose dim follows the
padded length (a recogniser's time steps) is cut back to what the request's own length gives, so
the caller gets what the unpadded request would have given wherever padding does not reach into
the real part (the model's receptive field at the right edge decides that: measure it).

The kit's generated traffic pads in the sampler (tritonkit/inputs.py); these are for requests a
user's own code makes, and `Client.infer(..., padded=True)` applies both from what the model's
config carries (`tritonkit_inputs` for the edges, `tritonkit_crop` for the outputs).
"""

from __future__ import annotations

import math

import numpy as np

from tritonkit.input_rules import InputRule
from tritonkit.inputs import pad


def request_length(arrays: dict[str, np.ndarray], rules: list[InputRule], batched: bool) -> int | None:
    """The length of a request along its padded dynamic dims (the first padded input's), or None."""
    lead = 1 if batched else 0
    for r in rules:
        if r.pad_to and r.name in arrays:
            j = next(j for j, d in enumerate(r.dims) if d == -1)
            return int(arrays[r.name].shape[lead + j])
    return None


def pad_request(arrays: dict[str, np.ndarray], rules: list[InputRule], batched: bool
                ) -> tuple[dict[str, np.ndarray], int | None]:
    """The arrays padded as the model's rules say, and the request's own length."""
    by_name = {r.name: r for r in rules}
    lead = 1 if batched else 0
    padded = {name: pad(by_name[name], a, lead) if name in by_name else a for name, a in arrays.items()}
    return padded, request_length(arrays, rules, batched)


def crop_outputs(outputs: dict[str, np.ndarray], length: int | None, crop: dict[str, tuple[int, int]],
                 batched: bool) -> dict[str, np.ndarray]:
    """Each output named in `crop` (name -> (per-sample dim, per)) cut to ceil(length / per)."""
    if length is None:
        return outputs
    out = dict(outputs)
    lead = 1 if batched else 0
    for name, (dim, per) in crop.items():
        if name in out:
            keep = math.ceil(length / per)
            out[name] = np.take(out[name], np.arange(keep), axis=lead + dim)
    return out
