"""Graph preparation: make a batch-1 export batch-dynamic, fold constants, clean up, toposort.
A graph with subgraphs (If/Loop/Scan) and nothing to make dynamic is left exactly as exported.

The prepared ONNX is what every runtime serves (ONNX Runtime directly, TensorRT through its
parser), so the batch range Triton is told about is the one the graph really accepts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from tritonkit.errors import InputError, input_error
from tritonkit.onnx_io import graph_inputs

from .load import dims

BATCH = "batch"  # symbolic name given to a batch axis that was exported fixed

REFUSE_FIX = "re-export the model with a dynamic batch axis (e.g. torch.onnx.export(dynamic_axes=...)), " \
             "or set max_batch_size: 0"


@dataclass
class Prepared:
    model: onnx.ModelProto
    static_batch: bool  # the original had a fixed batch of 1 that was made dynamic
    changes: list[str] = field(default_factory=list)  # what was done, for the progress line
    subgraphs: list[str] = field(default_factory=list)  # nodes holding subgraphs ("If 'pick'"), for messages


def prepare(model: onnx.ModelProto, batched: bool, file: str, at: str) -> Prepared:
    """`batched`: the spec serves the model with max_batch_size > 0, so dim 0 must be dynamic."""
    static = batched and _static_batch(model, file, at)
    holders = subgraph_nodes(model.graph)
    if holders and not static:
        # Nothing to make dynamic: a graph with If/Loop/Scan bodies is served exactly as exported
        # (folding and sorting across subgraph scopes is where GraphSurgeon breaks real exports).
        _check(model, file, at, "the exported graph", holders)
        return Prepared(model, False, ["subgraphs: graph left as exported"], holders)
    original_shapes = _inferred_dims(model) if static else {}
    try:
        out, changes = _surgery(model, static, original_shapes, file, at)
    except InputError:
        raise
    except Exception as e:  # GraphSurgeon on a graph it cannot take: say where, not a traceback
        raise input_error(file, at, f"preparing the graph failed{_where(holders)}: {_first_line(e)}",
                          REFUSE_FIX) from None
    if holders:
        changes.append("subgraphs folded and sorted too")
    return Prepared(_check(out, file, at, "the prepared graph", holders), static, changes or ["nothing to change"],
                    holders)


def _surgery(model: onnx.ModelProto, static: bool, original_shapes: dict[str, list[int | str]], file: str,
             at: str) -> tuple[onnx.ModelProto, list[str]]:
    graph = gs.import_onnx(model)
    changes: list[str] = []
    if static:
        for t in [*graph.inputs, *graph.outputs]:
            t.shape = [BATCH, *t.shape[1:]]
        # Shapes recorded at export time say batch 1; folding would bake that into constants, and
        # a runtime checks a subgraph's outputs against theirs.
        _forget_shapes(graph, {id(t) for t in [*graph.inputs, *graph.outputs]})
        changes.append("batch axis made dynamic")
    n_before = len(graph.nodes)
    graph.fold_constants(recurse_subgraphs=True).cleanup(recurse_subgraphs=True)
    if static:
        patched = _patch_reshapes(graph, original_shapes, file, at)
        if patched:
            changes.append(f"{patched} Reshape shape constant(s) patched")
    graph.cleanup(recurse_subgraphs=True).toposort(recurse_subgraphs=True)  # subgraphs sorted too
    if len(graph.nodes) != n_before:
        changes.append(f"{n_before - len(graph.nodes)} node(s) folded or removed")
    out = gs.export_onnx(graph)
    # Keep what the exporter chose: an older ONNX Runtime (NGC images) must still read it.
    out.ir_version = model.ir_version
    del out.opset_import[:]
    out.opset_import.extend(model.opset_import)
    out.producer_name, out.producer_version = model.producer_name, model.producer_version
    return out, changes


def _forget_shapes(graph: gs.Graph, keep: set[int]) -> None:
    """Clear the recorded shape of every variable but `keep`, in the graph and all its subgraphs."""
    for t in graph.tensors().values():
        if isinstance(t, gs.Variable) and id(t) not in keep:
            t.shape = None
    for node in graph.nodes:
        for attr in node.attrs.values():
            for sub in attr if isinstance(attr, list) else [attr]:
                if isinstance(sub, gs.Graph):
                    _forget_shapes(sub, keep)


def _check(model: onnx.ModelProto, file: str, at: str, what: str, holders: list[str]) -> onnx.ModelProto:
    try:
        onnx.checker.check_model(model)
        if holders:
            return model  # as exported (or as surgery left it): shapes already recorded stay as they are
        return onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception as e:
        raise input_error(file, at, f"{what} does not check{_where(holders)}: {_first_line(e)}",
                          REFUSE_FIX) from None


def subgraph_nodes(graph: onnx.GraphProto) -> list[str]:
    """One "If 'pick'" per node, at any depth, that holds a subgraph (If branches, Loop and Scan bodies)."""
    found = []
    for node in graph.node:
        subs = [g for a in node.attribute for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                                                    a.graphs if a.type == onnx.AttributeProto.GRAPHS else [])]
        if subs:
            found.append(f"{node.op_type} {node.name or node.output[0]!r}")
        for g in subs:
            found += subgraph_nodes(g)
    return found


def _where(holders: list[str]) -> str:
    if not holders:
        return ""
    more = f" and {len(holders) - 1} more" if len(holders) > 1 else ""
    return f" (it has subgraphs: {holders[0]}{more})"


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:200]


def _static_batch(model: onnx.ModelProto, file: str, at: str) -> bool:
    """True when every input and output has a fixed leading 1; refuse what cannot be a batch axis."""
    leading = {}
    for vi in [*graph_inputs(model), *model.graph.output]:
        d = dims(vi)
        if not d:
            raise input_error(file, f"{at}.max_batch_size",
                              f"ONNX tensor {vi.name!r} is a scalar, so the model has no batch axis",
                              "set max_batch_size: 0")
        leading[vi.name] = d[0]
    fixed = {n: v for n, v in leading.items() if isinstance(v, int)}
    if not fixed:
        return False
    if len(fixed) != len(leading) or set(fixed.values()) != {1}:
        shown = ", ".join(f"{n}: {v}" for n, v in leading.items())
        raise input_error(file, f"{at}.max_batch_size",
                          f"cannot make the batch axis dynamic safely: leading dims are {shown} (a dynamic "
                          "batch axis is served as it is; of fixed ones, only a batch of 1 on every input and output "
                          "can be made dynamic, so a batch-1 run is the reference)",
                          REFUSE_FIX)
    return True


def _inferred_dims(model: onnx.ModelProto) -> dict[str, list[int | str]]:
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    return {vi.name: dims(vi) for vi in [*g.input, *g.value_info, *g.output]}


def _batch_carrying(graph: gs.Graph) -> set[str]:
    """Names of tensors computed from a graph input: the only ones a batch axis can flow through."""
    seen = {t.name for t in graph.inputs}
    for node in graph.toposort().nodes:
        if any(t.name in seen for t in node.inputs):
            seen.update(t.name for t in node.outputs)
    return seen


def _patch_reshapes(graph: gs.Graph, original: dict[str, list[int | str]], file: str, at: str) -> int:
    """A Reshape to a constant shape starting with the old batch (1) would pin batch 1 again.

    Replace that leading 1 with -1 (infer it), or with 0 (copy dim 0 of the data) when -1 is already
    used elsewhere. A Reshape that moves the batch axis into another dim cannot be rewritten by
    editing one number: refuse it with its name.
    """
    carrying = _batch_carrying(graph)
    patched = 0
    for node in graph.nodes:
        if node.op != "Reshape" or len(node.inputs) < 2 or node.inputs[0].name not in carrying:
            continue
        shape_t = node.inputs[1]
        if not isinstance(shape_t, gs.Constant):
            continue  # computed from the data's Shape at run time: already follows the batch
        values = np.asarray(shape_t.values).astype(np.int64)
        data_dims = original.get(node.inputs[0].name, [])
        if values.ndim != 1 or not values.size or not data_dims or data_dims[0] != 1:
            continue
        allowzero = int(node.attrs.get("allowzero", 0))
        lead = int(values[0])
        if lead in (-1,) or (lead == 0 and not allowzero):
            continue
        where = f"Reshape {node.name or node.outputs[0].name!r}"
        if lead != 1:
            raise input_error(file, f"{at}.max_batch_size",
                              f"cannot make the batch axis dynamic safely: {where} reshapes the batch axis "
                              f"into shape {values.tolist()}", REFUSE_FIX)
        new = values.copy()
        if -1 not in values[1:]:
            new[0] = -1
        elif not allowzero:
            new[0] = 0
        else:
            raise input_error(file, f"{at}.max_batch_size",
                              f"cannot make the batch axis dynamic safely: {where} has shape {values.tolist()} "
                              "with -1 already used and allowzero=1", REFUSE_FIX)
        # A fresh constant per node: the original may be shared with nodes that must keep it.
        node.inputs[1] = gs.Constant(f"{shape_t.name}_dynamic_batch_{patched}", new)
        patched += 1
    return patched
