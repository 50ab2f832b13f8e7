"""Pipelines: the spec's models chained (or fanned out) and served as one Triton ensemble.

A `pipelines:` entry names the tensors a client sends and gets back, and for each step which of
its model's tensors reads or writes which pipeline tensor, as Triton's `ensemble_scheduling`
maps them. Everything Triton would refuse at load, or get wrong at the first request, is checked
here against the models' served tensors (the spec's, else the ONNX graph's) before anything is
written: the config is then built with Triton's protobuf schema like every other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from tritonkit.errors import Problem
from tritonkit.spec import ModelSpec, PipelineSpec, Spec, TensorSpec

# A model's served tensors (inputs, outputs), or None where its graph cannot be read (that is its
# own problem, reported at models[i].onnx).
Tensors = Callable[[ModelSpec], "tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]] | None"]


@dataclass(frozen=True)
class Wire:
    """One pipeline tensor: where it comes from (a step, or the client) and what it carries."""

    name: str
    dtype: str | None
    dims: tuple[int, ...] | None
    source: str  # "steps[1] (detector output boxes)" or "the pipeline's inputs"


def dims_agree(a: tuple[int, ...] | None, b: tuple[int, ...] | None) -> bool:
    """Same rank, and each dim equal where both are fixed (-1 takes any size)."""
    if a is None or b is None:
        return True
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b))


def pipeline_problems(spec: Spec, tensors: Tensors | None) -> list[Problem]:
    """Every pipeline's problems; `tensors` None: the structure only (no graph read yet)."""
    file = spec.shown
    problems: list[Problem] = []
    models = {m.name: m for m in spec.models}
    seen: set[str] = set()
    for i, p in enumerate(spec.pipelines):
        at = f"pipelines[{i}]"
        if p.name in models or p.name in seen:
            problems.append(Problem(file, f"{at}.name", f"{p.name!r} is already the name of a "
                                    f"{'model' if p.name in models else 'pipeline'}",
                                    "give the pipeline a name of its own (it is its folder in the repository)"))
        seen.add(p.name)
        problems += _one(file, at, p, models, tensors)
    return problems


def _one(file: str, at: str, p: PipelineSpec, models: dict[str, ModelSpec], tensors: Tensors | None) -> list[Problem]:
    problems: list[Problem] = []
    io: dict[int, tuple[dict[str, TensorSpec], dict[str, TensorSpec]] | None] = {}
    for j, step in enumerate(p.steps):
        m = models.get(step.model)
        if m is None:
            problems.append(Problem(file, f"{at}.steps[{j}].model", f"no model named {step.model!r} in the spec",
                                    f"use one of: {', '.join(models)}"))
            io[j] = None
            continue
        got = tensors(m) if tensors else None
        io[j] = None if got is None else ({t.name: t for t in got[0]}, {t.name: t for t in got[1]})

    # batch axes: Triton batches an ensemble only where every step batches
    batched = {step.model: models[step.model].max_batch_size > 0 for step in p.steps if step.model in models}
    if len(set(batched.values())) > 1:
        j = next(j for j, s in enumerate(p.steps) if s.model in batched and not batched[s.model])
        with_axis = ", ".join(n for n, b in batched.items() if b)
        problems.append(Problem(file, f"{at}.steps[{j}].model", f"{p.steps[j].model} has no batch axis "
                                f"(max_batch_size 0) but {with_axis} {'has' if ',' not in with_axis else 'have'} one",
                                "give every model of a pipeline a batch axis, or none of them"))

    same_axes = len(set(batched.values())) <= 1  # else per-sample dims are not comparable

    # who writes each pipeline tensor
    wires: dict[str, Wire] = {name: Wire(name, None, None, "the pipeline's inputs") for name in p.inputs}
    producer: dict[str, int] = {}
    for j, step in enumerate(p.steps):
        for own, wire in step.outputs.items():
            where = f"{at}.steps[{j}].outputs.{own}"
            outs = io[j][1] if io[j] else None
            if outs is not None and own not in outs:
                problems.append(Problem(file, where, f"{step.model} has no output {own!r}",
                                        f"use one of its outputs: {', '.join(outs)}"))
                continue
            if wire in wires:
                problems.append(Problem(file, where, f"pipeline tensor {wire!r} is already written by "
                                        f"{wires[wire].source}", "give this output a pipeline tensor name of its own"))
                continue
            t = outs[own] if outs else None
            wires[wire] = Wire(wire, t.dtype if t else None, None if t is None or t.dims is None else tuple(t.dims),
                               f"steps[{j}] ({step.model} output {own})")
            producer[wire] = j

    # what each step reads, against what was written
    read: set[str] = set()
    for j, step in enumerate(p.steps):
        ins = io[j][0] if io[j] else None
        if ins is not None:
            for name in ins:
                if name not in step.inputs:
                    problems.append(Problem(file, f"{at}.steps[{j}].inputs", f"{step.model}'s input {name!r} "
                                            "is not mapped", f"map it to a pipeline tensor: `{name}: <tensor>`"))
        for own, wire in step.inputs.items():
            where = f"{at}.steps[{j}].inputs.{own}"
            if ins is not None and own not in ins:
                problems.append(Problem(file, where, f"{step.model} has no input {own!r}",
                                        f"use one of its inputs: {', '.join(ins)}"))
                continue
            read.add(wire)
            w = wires.get(wire)
            if w is None:
                problems.append(Problem(file, where, f"no step writes pipeline tensor {wire!r} and it is not one "
                                        "of the pipeline's inputs",
                                        f"add it to {at}.inputs, or map a step's output to it"))
                continue
            t = ins[own] if ins else None
            if t is None:
                continue
            if w.source == "the pipeline's inputs" and w.dtype is None:  # the first reader fixes what is sent
                wires[wire] = Wire(wire, t.dtype, None if t.dims is None else tuple(t.dims),
                                   f"the pipeline's inputs (as {step.model} input {own} reads it)")
                continue
            if w.dtype and t.dtype and w.dtype != t.dtype:
                problems.append(Problem(file, where, f"{wire!r} is {w.dtype} from {w.source}, but {step.model} "
                                        f"input {own} takes {t.dtype}",
                                        "map a tensor of the same type, or cast inside one of the models"))
            elif same_axes and not dims_agree(w.dims, None if t.dims is None else tuple(t.dims)):
                problems.append(Problem(file, where, f"{wire!r} has dims {list(w.dims or ())} from {w.source}, but "
                                        f"{step.model} input {own} takes {list(t.dims or ())} (-1: any size)",
                                        "map a tensor of a compatible shape"))

    for k, name in enumerate(p.inputs):
        if name not in read:
            problems.append(Problem(file, f"{at}.inputs[{k}]", f"no step reads pipeline input {name!r}",
                                    "remove it, or map a step's input to it"))
    for k, name in enumerate(p.outputs):
        if name not in producer:
            problems.append(Problem(file, f"{at}.outputs[{k}]", f"no step writes pipeline output {name!r}",
                                    "map a step's output to it"))
    for wire, j in producer.items():
        if wire not in read and wire not in p.outputs:
            own = next(o for o, w in p.steps[j].outputs.items() if w == wire)
            problems.append(Problem(file, f"{at}.steps[{j}].outputs.{own}", f"pipeline tensor {wire!r} is written "
                                    "but nothing reads it", f"add it to {at}.outputs, or leave this output unmapped"))

    cycle = _cycle({j: {producer[w] for w in s.inputs.values() if w in producer} for j, s in enumerate(p.steps)})
    if cycle:
        problems.append(Problem(file, f"{at}.steps", "the steps form a cycle: " + " -> ".join(
            f"steps[{j}] ({p.steps[j].model})" for j in cycle), "a pipeline's tensors must flow one way: "
            "remove one of these mappings"))
    return problems


def _cycle(after: dict[int, set[int]]) -> list[int]:
    """A cycle in the steps' order (step -> the steps whose outputs it reads), [] when none."""
    state: dict[int, int] = {}  # 1: on the path, 2: done
    path: list[int] = []

    def visit(j: int) -> list[int]:
        state[j] = 1
        path.append(j)
        for k in sorted(after[j]):
            if state.get(k) == 1:
                return path[path.index(k):] + [k]
            if k not in state and (found := visit(k)):
                return found
        state[j] = 2
        path.pop()
        return []

    for j in after:
        if j not in state and (found := visit(j)):
            return found
    return []


def wires_of(p: PipelineSpec, tensors: dict[str, tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]]
             ) -> tuple[list[tuple[TensorSpec, str]], list[TensorSpec]]:
    """A checked pipeline's inputs (each as its first reader takes it, with that reader's model) and
    outputs (as their step writes them), named as the pipeline names them."""
    inputs, outputs = [], []
    for name in p.inputs:
        step, own = next((s, o) for s in p.steps for o, w in s.inputs.items() if w == name)
        t = next(t for t in tensors[step.model][0] if t.name == own)
        inputs.append((t.model_copy(update={"name": name}), step.model))
    for name in p.outputs:
        step, own = next((s, o) for s in p.steps for o, w in s.outputs.items() if w == name)
        t = next(t for t in tensors[step.model][1] if t.name == own)
        outputs.append(t.model_copy(update={"name": name}))
    return inputs, outputs


def ensemble_steps(cfg: mc.ModelConfig, p: PipelineSpec) -> None:
    for step in p.steps:
        s = cfg.ensemble_scheduling.step.add(model_name=step.model, model_version=-1)
        for own, wire in step.inputs.items():
            s.input_map[own] = wire
        for own, wire in step.outputs.items():
            s.output_map[own] = wire
