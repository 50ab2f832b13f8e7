"""The cases `tritonkit bench versus` measures the tuner and Model Analyzer on: models built with
the onnx helper (no downloads), each served from the config a new user writes first (one instance,
`max_batch_size` with no queue delay), where tuning has something to find.

- mlp: the sample model, memory-bandwidth bound: batching pays.
- detector: convolutions at the `opt` shape, H and W dynamic on a stride of 32: compute bound, so
  batching pays little on a CPU and instances may matter more.
- tiny: a small MLP whose fixed cost per request dominates its compute.
- latency: the sample model at a fixed rate (`slo.rps`): the lowest P95 there.

Two more the tuner's constants were never fitted to, held out to show what a new user's model gets:
- convnet: a small convolutional classifier over 64x64 images (two strided convolutions, a global
  pool, a linear head), P95 <= 20 ms.
- wide: a wide convolutional recogniser over 160x160 images whose one request takes tens of
  milliseconds on a CPU core, P95 <= 100 ms.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

from tritonkit import sample_model
from tritonkit.errors import InputError, flag_problem
from tritonkit.files import write_bytes_atomic

CASES = ("mlp", "detector", "tiny", "latency", "convnet", "wide")
HELD_OUT = ("convnet", "wide")  # cases no constant of the tuner was tuned on


def detector(path: Path, channels: int = 32, seed: int = 3) -> Path:
    """images [B, 3, H, W] -> heat [B, 4, H/4, W/4]: two strided 3x3 convolutions and a 1x1 head."""
    rng = np.random.default_rng(seed)

    def w(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        fan_in = int(np.prod(shape[1:]))
        return numpy_helper.from_array((rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["images", "c1"], ["a1"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a1"], ["r1"]),
             helper.make_node("Conv", ["r1", "c2"], ["a2"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a2"], ["r2"]),
             helper.make_node("Conv", ["r2", "head"], ["heat"])]
    graph = helper.make_graph(
        nodes, "detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "H", "W"])],
        [helper.make_tensor_value_info("heat", TensorProto.FLOAT, ["batch", 4, "h", "w"])],
        initializer=[w("c1", (channels, 3, 3, 3)), w("c2", (channels, channels, 3, 3)), w("head", (4, channels, 1, 1))])
    model = helper.make_model(graph, producer_name="triton-edge-kit", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    write_bytes_atomic(path, model.SerializeToString())
    return path


def classifier(path: Path, convs: list[tuple[int, int]], size: int, classes: int, seed: int) -> Path:
    """images [B, 3, size, size] -> logits [B, classes]: 3x3 convolutions (out channels, stride),
    each with a ReLU, a global average pool and a linear head, as image classifiers are exported."""
    rng = np.random.default_rng(seed)

    def w(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        fan_in = int(np.prod(shape[1:]))
        return numpy_helper.from_array((rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32), name)

    nodes, inits, x, channels = [], [], "images", 3
    for i, (out, stride) in enumerate(convs):
        inits.append(w(f"c{i}", (out, channels, 3, 3)))
        nodes += [helper.make_node("Conv", [x, f"c{i}"], [f"a{i}"], strides=[stride, stride], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"])]
        x, channels = f"r{i}", out
    inits += [w("head", (channels, classes)), numpy_helper.from_array(np.zeros(classes, np.float32), "bias")]
    nodes += [helper.make_node("GlobalAveragePool", [x], ["pooled"]),
              helper.make_node("Flatten", ["pooled"], ["flat"]),
              helper.make_node("Gemm", ["flat", "head", "bias"], ["logits"])]
    graph = helper.make_graph(
        nodes, path.stem,
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])], initializer=inits)
    model = helper.make_model(graph, producer_name="triton-edge-kit", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    write_bytes_atomic(path, model.SerializeToString())
    return path


def line_recogniser(path: Path, channels: int = 32, classes: int = 40, seed: int = 11) -> Path:
    """text lines [B, 3, 48, W] -> logits [B, W/4, classes], as a CTC recogniser is exported: a 3x3
    convolution, a 1x1 one, a max pool that folds the height and takes W in steps of 4, a linear
    head per time step. W is dynamic; an output step sees input columns 4t-1 .. 4t+4 only, so a
    line padded on the right with zeros gives, cut back to W/4 steps, what the line alone gives."""
    rng = np.random.default_rng(seed)

    def w(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        fan_in = int(np.prod(shape[1:]))
        return numpy_helper.from_array((rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["line", "c1"], ["a1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a1"], ["r1"]),
             helper.make_node("Conv", ["r1", "c2"], ["a2"]),
             helper.make_node("Relu", ["a2"], ["r2"]),
             helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[48, 4], strides=[48, 4]),
             helper.make_node("Squeeze", ["p", "h_axis"], ["steps_first"]),
             helper.make_node("Transpose", ["steps_first"], ["steps"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["steps", "head"], ["logits"])]
    graph = helper.make_graph(
        nodes, "line_recogniser",
        [helper.make_tensor_value_info("line", TensorProto.FLOAT, ["batch", 3, 48, "W"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "T", classes])],
        initializer=[w("c1", (channels // 2, 3, 3, 3)), w("c2", (channels, channels // 2, 1, 1)),
                     numpy_helper.from_array((rng.standard_normal((channels, classes)) / np.sqrt(channels))
                                             .astype(np.float32), "head"),
                     numpy_helper.from_array(np.array([2], np.int64), "h_axis")])
    model = helper.make_model(graph, producer_name="triton-edge-kit", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    write_bytes_atomic(path, model.SerializeToString())
    return path


def write_case(name: str, folder: Path) -> Path:
    """The case's ONNX file and deploy.yaml in `folder`; returns the spec's path."""
    if name not in CASES:
        raise InputError([flag_problem("--case", f"use one of {', '.join(CASES)}")])
    folder.mkdir(parents=True, exist_ok=True)
    naive = {"max_queue_delay_us": 0}
    if name in ("mlp", "latency"):
        sample_model.write(folder / "mlp.onnx")
        model = {"name": name, "onnx": "mlp.onnx", "max_batch_size": 16, "batching": naive,
                 "slo": {"p95_ms": 25} if name == "mlp" else {"p95_ms": 25, "rps": 400}}
    elif name == "convnet":
        classifier(folder / "convnet.onnx", [(32, 2), (64, 2)], size=64, classes=10, seed=5)
        model = {"name": name, "onnx": "convnet.onnx", "max_batch_size": 16, "batching": naive, "slo": {"p95_ms": 20}}
    elif name == "wide":
        classifier(folder / "wide.onnx", [(64, 1), (64, 2), (128, 2)], size=160, classes=100, seed=7)
        model = {"name": name, "onnx": "wide.onnx", "max_batch_size": 16, "batching": naive, "slo": {"p95_ms": 100}}
    elif name == "tiny":
        sample_model.write(folder / "tiny.onnx", width=64, layers=2)
        model = {"name": name, "onnx": "tiny.onnx", "max_batch_size": 16, "batching": naive, "slo": {"p95_ms": 10}}
    else:
        detector(folder / "detector.onnx")
        model = {"name": name, "onnx": "detector.onnx", "max_batch_size": 8, "batching": naive,
                 "inputs": [{"name": "images", "dtype": "FP32", "dims": [3, -1, -1], "min": [3, 64, 64],
                             "opt": [3, 256, 256], "max": [3, 512, 512], "stride": 32}],
                 "slo": {"p95_ms": 100}}
    spec = folder / "deploy.yaml"
    spec.write_text(yaml.safe_dump({"models": [model]}, sort_keys=False))
    return spec


# An edge box's three models of different costs, one traffic mix, an SLO each (`bench mix`): a
# strided detector (milliseconds per image), the sample classifier (batching pays), a tiny
# recogniser whose fixed cost per request dominates. Each starts from the config a new user writes.
MIX_TRAFFIC = {"detector": 30.0, "classifier": 120.0, "recogniser": 150.0}


def write_mix(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    detector(folder / "detector.onnx")
    sample_model.write(folder / "classifier.onnx")
    sample_model.write(folder / "recogniser.onnx", width=64, layers=2)
    naive = {"max_queue_delay_us": 0}
    models = [
        {"name": "detector", "onnx": "detector.onnx", "max_batch_size": 8, "batching": naive,
         "inputs": [{"name": "images", "dtype": "FP32", "dims": [3, -1, -1], "min": [3, 64, 64],
                     "opt": [3, 384, 384], "max": [3, 512, 512], "stride": 32}],
         "slo": {"p95_ms": 60}},
        {"name": "classifier", "onnx": "classifier.onnx", "max_batch_size": 16, "batching": naive,
         "slo": {"p95_ms": 25}},
        {"name": "recogniser", "onnx": "recogniser.onnx", "max_batch_size": 16, "batching": naive,
         "slo": {"p95_ms": 10}},
    ]
    spec = folder / "deploy.yaml"
    spec.write_text(yaml.safe_dump({"models": models, "traffic": MIX_TRAFFIC}, sort_keys=False))
    return spec
