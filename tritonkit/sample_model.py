"""The sample model: an MLP whose cost shows the batching economics of ARCHITECTURE.md (the tuner).

Four 2048x2048 FP32 layers are 64 MiB of weights. At batch 1 each request streams all of them
from memory, so the run is bandwidth bound; at batch 8 the same weights serve eight rows and the
call costs little more. That is the `T(B) = C_fixed + B*C_per` shape with a large C_fixed.
Built with the onnx helper from a fixed seed: no downloads, and the same bytes every time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tritonkit.files import write_bytes_atomic

INPUT_NAME = "input"
OUTPUT_NAME = "output"


def build(width: int = 2048, layers: int = 4, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = INPUT_NAME
    for i in range(layers):
        # He-style scale keeps activations O(1) through the ReLUs, so outputs stay finite.
        w = (rng.standard_normal((width, width)) * np.sqrt(2.0 / width)).astype(np.float32)
        b = np.zeros(width, dtype=np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == layers - 1
        y = OUTPUT_NAME if last else f"h{i}"
        gemm_out = y if last else f"g{i}"
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [gemm_out], name=f"gemm{i}"))
        if not last:
            nodes.append(helper.make_node("Relu", [gemm_out], [y], name=f"relu{i}"))
        x = y
    graph = helper.make_graph(
        nodes,
        "edge_mlp",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", width])],
        initializer=inits,
    )
    model = helper.make_model(graph, producer_name="triton-edge-kit",
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by every ONNX Runtime the NGC images ship
    onnx.checker.check_model(model)
    return model


def write(path: Path, width: int = 2048, layers: int = 4, seed: int = 0) -> Path:
    """Write the model atomically; an identical file already there is left alone."""
    write_bytes_atomic(path, build(width, layers, seed).SerializeToString())
    return path
