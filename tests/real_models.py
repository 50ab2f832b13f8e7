"""Small ONNX models shaped like what real exporters produce, built with the onnx helper (no
downloads). Each one carries the trait that broke the kit on a user's model: integer IDs into an
embedding, a rank-0 scalar and state in a model with If subgraphs and no batch axis, a stride
bound on dynamic H/W, a `-1` batch axis, a dynamic width, and an output whose size depends on
the data. Their weights are random but seeded, so ONNX Runtime is the reference for outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


def _w(name: str, shape: tuple[int, ...], seed: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.1,
                                   name)


def _i64(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def text_classifier(path: Path, vocab: int = 1000, dim: int = 32, classes: int = 3) -> Path:
    """input_ids, attention_mask: INT64 [batch, seq] -> logits [batch, classes]. The embedding's
    Gather fails for an id outside 0..vocab-1, as a BERT export does."""
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["emb"], axis=0),            # [B, S, D]
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),      # [B, S]
        helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"]),                        # [B, S, 1]
        helper.make_node("Mul", ["emb", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),          # [B, D]
        helper.make_node("ReduceSum", ["maskf", "axis1"], ["count"], keepdims=1),            # [B, 1]
        helper.make_node("Max", ["count", "one"], ["safe_count"]),
        helper.make_node("Div", ["summed", "safe_count"], ["pooled"]),
        helper.make_node("MatMul", ["pooled", "head"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "text_classifier",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        initializer=[_w("embedding", (vocab, dim), 1), _w("head", (dim, classes), 2), _i64("axis1", [1]),
                     _i64("axis2", [2]), numpy_helper.from_array(np.array([1.0], np.float32), "one")])
    return _save(graph, path)


def stateful_audio(path: Path, hidden: int = 128) -> Path:
    """A VAD-style streaming model: input [N, T], state [2, N, hidden], sr INT64 scalar (rank 0)
    -> prob [N, 1], stateN [2, N, hidden]. The sample rate picks one of two If branches, each
    with its own weights inside the subgraph. The batch is not the first axis of every input, so
    it is served with max_batch_size 0."""
    def branch(name: str, seed: int) -> onnx.GraphProto:
        nodes = [helper.make_node("ReduceMean", ["input"], ["level"], axes=[1], keepdims=1),        # [N, 1]
                 helper.make_node("MatMul", ["level", f"{name}_proj"], ["proj"]),                   # [N, hidden]
                 helper.make_node("Tanh", ["proj"], [f"{name}_out"])]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT,
                                                                                   ["N", hidden])],
                                 initializer=[_w(f"{name}_proj", (1, hidden), seed)])

    nodes = [
        helper.make_node("Equal", ["sr", "sr16k"], ["is16k"]),
        helper.make_node("If", ["is16k"], ["feature"], then_branch=branch("at16k", 3), else_branch=branch("at8k", 4)),
        helper.make_node("Add", ["state", "feature"], ["mixed"]),                                    # [2, N, hidden]
        helper.make_node("Tanh", ["mixed"], ["stateN"]),
        helper.make_node("ReduceMean", ["stateN"], ["pooled"], axes=[0], keepdims=0),                # [N, hidden]
        helper.make_node("MatMul", ["pooled", "readout"], ["logit"]),                               # [N, 1]
        helper.make_node("Sigmoid", ["logit"], ["prob"]),
    ]
    graph = helper.make_graph(
        nodes, "stateful_audio",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", "T"]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "N", hidden]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["N", 1]),
         helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, "N", hidden])],
        initializer=[_i64("sr16k", 16000), _w("readout", (hidden, 1), 5)])
    return _save(graph, path)


def _minus_one_batch(model_path: Path) -> None:
    """Write the batch axis as dim_value -1, as Paddle's exporter does (not a symbolic name)."""
    model = onnx.load(model_path)
    for vi in [*model.graph.input, *model.graph.output]:
        dim = vi.type.tensor_type.shape.dim[0]
        dim.Clear()
        dim.dim_value = -1
    onnx.save(model, model_path)


def stride_detector(path: Path, stride: int = 32) -> Path:
    """images [-1, 3, H, W] -> heat [-1, 3, H, W]: pooled by `stride`, upsampled back and added to
    the input, so H and W must be multiples of the stride (as in an FPN detector)."""
    nodes = [
        helper.make_node("Conv", ["images", "stem"], ["wide"], pads=[1, 1, 1, 1]),                  # [B, 32, H, W]
        helper.make_node("Relu", ["wide"], ["act"]),
        helper.make_node("Conv", ["act", "squeeze"], ["feat"]),                                     # [B, 3, H, W]
        helper.make_node("AveragePool", ["feat"], ["coarse"], kernel_shape=[stride, stride], strides=[stride, stride]),
        helper.make_node("Resize", ["coarse", "", "scales"], ["fine"], mode="nearest"),
        helper.make_node("Add", ["feat", "fine"], ["heat"]),
    ]
    graph = helper.make_graph(
        nodes, "stride_detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "H", "W"])],
        [helper.make_tensor_value_info("heat", TensorProto.FLOAT, ["batch", 3, "H", "W"])],
        initializer=[_w("stem", (32, 3, 3, 3), 6), _w("squeeze", (3, 32, 1, 1), 12),
                     numpy_helper.from_array(np.array([1, 1, stride, stride], np.float32), "scales")])
    _save(graph, path)
    _minus_one_batch(path)
    return path


def minus_one_classifier(path: Path, features: int = 16, classes: int = 4) -> Path:
    """x [-1, features] -> probs [-1, classes], the batch axis written as -1."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=1)]
    graph = helper.make_graph(nodes, "minus_one_classifier",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", features])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", classes])],
                              initializer=[_w("w", (features, classes), 7)])
    _save(graph, path)
    _minus_one_batch(path)
    return path


def recogniser(path: Path, height: int = 32, classes: int = 37) -> Path:
    """A text-line recogniser: image [batch, 1, height, width] with a dynamic width -> per-column
    logits [batch, width, classes]. Its cost grows with the width."""
    nodes = [
        helper.make_node("ReduceMean", ["image"], ["cols"], axes=[2], keepdims=0),                  # [B, 1, W]
        helper.make_node("Transpose", ["cols"], ["seq"], perm=[0, 2, 1]),                           # [B, W, 1]
        helper.make_node("MatMul", ["seq", "expand"], ["hidden"]),                                  # [B, W, 64]
        helper.make_node("Relu", ["hidden"], ["act"]),
        helper.make_node("MatMul", ["act", "cls"], ["logits"]),                                     # [B, W, C]
    ]
    graph = helper.make_graph(
        nodes, "recogniser",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, height, "width"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "width", classes])],
        initializer=[_w("expand", (1, 64), 8), _w("cls", (64, classes), 9)])
    return _save(graph, path)


def nms_detector(path: Path, anchors: int = 64) -> Path:
    """A YOLO-style head: images [batch, 3, 32, 32] -> boxes [batch, anchors, 4], scores
    [batch, 1, anchors], and the NMS-selected indices [num_selected, 3], whose first axis
    depends on the data (so the model is served with max_batch_size 0)."""
    nodes = [
        helper.make_node("Flatten", ["images"], ["flat"], axis=1),                                  # [B, 3072]
        helper.make_node("MatMul", ["flat", "box_w"], ["box_flat"]),                                # [B, A*4]
        helper.make_node("Reshape", ["box_flat", "box_shape"], ["boxes_raw"]),                      # [B, A, 4]
        helper.make_node("Sigmoid", ["boxes_raw"], ["boxes"]),
        helper.make_node("MatMul", ["flat", "score_w"], ["score_flat"]),                            # [B, A]
        helper.make_node("Sigmoid", ["score_flat"], ["score_p"]),
        helper.make_node("Unsqueeze", ["score_p", "axis1"], ["scores"]),                           # [B, 1, A]
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "thresh"], ["selected"]),
    ]
    graph = helper.make_graph(
        nodes, "nms_detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["batch", anchors, 4]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 1, anchors]),
         helper.make_tensor_value_info("selected", TensorProto.INT64, ["num_selected", 3])],
        initializer=[_w("box_w", (3 * 32 * 32, anchors * 4), 10), _w("score_w", (3 * 32 * 32, anchors), 11),
                     _i64("box_shape", [0, anchors, 4]), _i64("axis1", [1]), _i64("max_out", [10]),
                     numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
                     numpy_helper.from_array(np.array([0.3], np.float32), "thresh")])
    return _save(graph, path)
