"""Small ONNX models for the tests, built with the onnx helper (no downloads)."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from tritonkit import sample_model


def mlp(path: Path, width: int = 256, layers: int = 2) -> Path:
    return sample_model.write(path, width=width, layers=layers)


def seq_mean(path: Path) -> Path:
    """x: [batch, seq] FP32 -> mean over seq: [batch, 1]. Zero padding would change the mean,
    so it shows whether requests of different lengths were padded together."""
    node = helper.make_node("ReduceMean", ["x"], ["mean"], axes=[1], keepdims=1)
    graph = helper.make_graph([node], "seq_mean",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
                              [helper.make_tensor_value_info("mean", TensorProto.FLOAT, ["batch", 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


def two_input_int64(path: Path) -> Path:
    """ids, mask: [batch, seq] INT64 -> ids * mask."""
    node = helper.make_node("Mul", ["ids", "mask"], ["out"])
    graph = helper.make_graph([node], "two_input",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
                               helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "seq"])],
                              [helper.make_tensor_value_info("out", TensorProto.INT64, ["batch", "seq"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


def lookup(path: Path, rows: int = 10, width: int = 4) -> Path:
    """ids: [batch, seq] INT64 -> table[ids]: [batch, seq, width]. An id outside 0..rows-1 passes
    Triton's shape checks but fails inside ONNX Runtime: a request that is bad only at run time."""
    import numpy as np
    from onnx import numpy_helper

    table = numpy_helper.from_array(np.arange(rows * width, dtype=np.float32).reshape(rows, width), "table")
    node = helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0)
    graph = helper.make_graph([node], "lookup",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
                              [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["batch", "seq", width])],
                              initializer=[table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path
