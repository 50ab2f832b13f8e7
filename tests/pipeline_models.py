"""A camera box's three models, built with the onnx helper: a backbone whose features feed two
heads (a fan-out), as exporters write them (`-1`/named batch axes, a dynamic dim, MatMul weights
as initializers). Each model runs alone in ONNX Runtime, so a pipeline's answer can be checked
against the chain run step by step."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FEATURES = 64


def _save(nodes, name, inputs, outputs, inits, path: Path) -> Path:
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, initializer=inits),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


def _w(name: str, shape: tuple[int, ...], seed: int) -> onnx.TensorProto:
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)


def backbone(path: Path, width: int = 32, cost: int = 2) -> Path:
    """pixels [batch, width] FP32 -> features [batch, FEATURES]: `cost` MatMul+Relu layers."""
    nodes, inits, x = [], [], "pixels"
    for i in range(cost):
        inits.append(_w(f"w{i}", (width if i == 0 else FEATURES, FEATURES), seed=i))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"]), helper.make_node("Relu", [f"h{i}"], [f"r{i}"])]
        x = f"r{i}"
    nodes.append(helper.make_node("Identity", [x], ["features"]))
    return _save(nodes, "backbone", [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, [-1, width])],
                 [helper.make_tensor_value_info("features", TensorProto.FLOAT, [-1, FEATURES])], inits, path)


def box_head(path: Path) -> Path:
    """feat [N, FEATURES] -> boxes [N, 4] (a named batch axis, as torch.onnx.export writes it)."""
    return _save([helper.make_node("MatMul", ["feat", "wb"], ["boxes"])], "box_head",
                 [helper.make_tensor_value_info("feat", TensorProto.FLOAT, ["N", FEATURES])],
                 [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["N", 4])],
                 [_w("wb", (FEATURES, 4), seed=10)], path)


def class_head(path: Path, classes: int = 10) -> Path:
    """feat [N, FEATURES] -> scores [N, classes], softmaxed."""
    return _save([helper.make_node("MatMul", ["feat", "wc"], ["logits"]),
                  helper.make_node("Softmax", ["logits"], ["scores"], axis=1)], "class_head",
                 [helper.make_tensor_value_info("feat", TensorProto.FLOAT, ["N", FEATURES])],
                 [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", classes])],
                 [_w("wc", (FEATURES, classes), seed=11)], path)


def int_head(path: Path) -> Path:
    """ids [N, FEATURES] INT64 -> ids + 1: a head whose input type no float feature matches."""
    one = numpy_helper.from_array(np.array(1, dtype=np.int64), "one")
    return _save([helper.make_node("Add", ["ids", "one"], ["out"])], "int_head",
                 [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", FEATURES])],
                 [helper.make_tensor_value_info("out", TensorProto.INT64, ["N", FEATURES])], [one], path)


def narrow_head(path: Path) -> Path:
    """feat [N, 32] -> [N, 4]: a head built for a smaller backbone."""
    return _save([helper.make_node("MatMul", ["feat", "wn"], ["boxes"])], "narrow_head",
                 [helper.make_tensor_value_info("feat", TensorProto.FLOAT, ["N", 32])],
                 [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["N", 4])],
                 [_w("wn", (32, 4), seed=12)], path)


def write_all(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return {"backbone": backbone(folder / "backbone.onnx"), "box_head": box_head(folder / "box_head.onnx"),
            "class_head": class_head(folder / "class_head.onnx"), "int_head": int_head(folder / "int_head.onnx"),
            "narrow_head": narrow_head(folder / "narrow_head.onnx"), "relay": relay(folder / "relay.onnx"),
            "ids_and_mask": ids_and_mask(folder / "ids_and_mask.onnx")}


CAMERA = {
    "name": "camera",
    "inputs": ["image"],
    "outputs": ["boxes", "scores"],
    "steps": [
        {"model": "backbone", "inputs": {"pixels": "image"}, "outputs": {"features": "feat"}},
        {"model": "box_head", "inputs": {"feat": "feat"}, "outputs": {"boxes": "boxes"}},
        {"model": "class_head", "inputs": {"feat": "feat"}, "outputs": {"scores": "scores"}},
    ],
    "slo": {"p95_ms": 50},
}


def camera_spec(onnx_dir: Path, pipeline: dict | None = None, extra_models: tuple[dict, ...] = ()) -> dict:
    """deploy.yaml's content for the three models and the camera pipeline (or `pipeline`)."""
    models = [{"name": n, "onnx": str(onnx_dir / f"{n}.onnx"), "max_batch_size": 8, "warmup": False,
               "batching": {"max_queue_delay_us": 500}} for n in ("backbone", "box_head", "class_head")]
    return {"models": models + list(extra_models), "pipelines": [copy.deepcopy(pipeline or CAMERA)],
            "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0}}


def ids_and_mask(path: Path) -> Path:
    """ids, mask [N, seq] INT64 -> ids * mask: a step with two inputs."""
    return _save([helper.make_node("Mul", ["ids", "mask"], ["out"])], "ids_and_mask",
                 [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", "seq"]),
                  helper.make_tensor_value_info("mask", TensorProto.INT64, ["N", "seq"])],
                 [helper.make_tensor_value_info("out", TensorProto.INT64, ["N", "seq"])], [], path)


def relay(path: Path) -> Path:
    """x [N, FEATURES] -> y, unchanged: two of them can be wired into a loop."""
    return _save([helper.make_node("Identity", ["x"], ["y"])], "relay",
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", FEATURES])], [], path)
