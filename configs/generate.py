"""Build each model's ModelConfig from the spec and write the repository folder.

The message is built with Triton's own protobuf schema (`model_config_pb2`), so a field that
Triton does not know cannot be written, and text_format prints it the way Triton parses it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import json
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tritonkit import onnx_io
from tritonkit.build_engines import gpu
from tritonkit.build_engines.artifacts import serving_batch, serving_problems
from tritonkit.configs.gateway import behind_gateway
from tritonkit.configs.loader import check
from tritonkit.configs.overlay import set_batching
from tritonkit.configs.pipelines import ensemble_steps, wires_of
from tritonkit.errors import InputError, Problem
from tritonkit.files import copy_file_atomic, write_bytes_atomic
from tritonkit.input_rules import CROP_PARAMETER, PARAMETER, InputRule, rules_parameter
from tritonkit.inputs import Sampler
from tritonkit.server import find_install
from tritonkit.spec import ModelSpec, PipelineSpec, Spec, TensorSpec
from tritonkit.support import Target, spec_target

VERSION = "1"  # one served version per model; the repository is regenerated, not versioned by hand
RUNNER_FILE = "runner_model.py"
RULES_FILE = "input_rules.py"
TIMINGS_FILE = "runner_timings.py"
SESSION_FILE = "ort_session.py"


@dataclass(frozen=True)
class ResolvedModel:
    """A model with everything the spec left to defaults filled in: tensors, runtime, instance kind."""

    spec: ModelSpec
    onnx_path: Path
    runtime: str  # tensorrt | onnxruntime | python-onnxruntime
    kind: str  # the instance kind `instances.kind: auto` means here: gpu | cpu
    on_node: bool  # a TensorRT engine the node builds: the version folder carries the ONNX it builds from
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # From build_engines.plan (the one max-batch rule); None = the spec's value.
    max_batch_size: int | None = None
    profiles: tuple[int, ...] = ()  # TensorRT optimization profiles the instances use (length buckets)


@functools.cache  # asked once per model; the answer does not change while the process runs
def gpu_present() -> bool:
    """TensorRT 10+ and a GPU the NVIDIA driver sees (Jetson's iGPU included): the one test of
    whether engines can be built and served here lives in `build_engines.gpu`."""
    return gpu.target().reason is None


def local_onnx_runtime() -> str:
    """The ONNX path the local tritonserver has (`server.find_install`, the one that `serve` starts):
    Triton's native onnxruntime backend where its install has it (a full build on PATH or named by
    $TRITONSERVER), else ONNX Runtime inside the python backend (the bundled server)."""
    return "onnxruntime" if find_install().has_backend("onnxruntime") else "python-onnxruntime"


def resolve_runtime(m: ModelSpec, target: str | Target) -> str:
    """`auto` on a deploy target: what the node's image and GPU serve (`support.Target.runtime`); on
    the local server: TensorRT only where a GPU, TensorRT and the server's tensorrt backend all are,
    else the ONNX path that server has (`local_onnx_runtime`). Never a backend the server lacks."""
    if isinstance(target, Target):
        return target.runtime(m.runtime)
    if m.runtime != "auto":
        return m.runtime
    if gpu_present() and find_install().has_backend("tensorrt"):
        return "tensorrt"
    return local_onnx_runtime()


def resolve(spec: Spec, m: ModelSpec, target: str | Target = "local", out: Path | None = None) -> ResolvedModel:
    """`target`: "local", or a deploy target (a `support.Target`; "ngc" is the spec's own deploy block)."""
    if target == "ngc":
        target = spec_target(spec)
    path = spec.onnx_path(m)
    io = onnx_io.read_io(path)
    batched = m.max_batch_size > 0
    runtime = resolve_runtime(m, target)
    on_node = isinstance(target, Target) and runtime == "tensorrt"
    kind = target.instance_kind(runtime) if isinstance(target, Target) else ("gpu" if runtime == "tensorrt" else "cpu")
    max_batch, profiles = serving_batch(spec, m, out, runtime, planned=on_node)
    return ResolvedModel(m, path, runtime, kind, on_node, onnx_io.merged(m.inputs, io.inputs, batched),
                         onnx_io.merged(m.outputs, io.outputs, batched), max_batch, profiles)


def input_rules(r: ResolvedModel) -> list[InputRule]:
    """What requests to this model may carry, from the resolved inputs; the config carries it as
    the `tritonkit_inputs` parameter (tritonkit/inputs.py)."""
    def t(v):
        return None if v is None else tuple(v)

    m = r.spec

    def lengths(i: TensorSpec) -> tuple | None:
        if i.lengths is None:
            return None
        if i.lengths.dist == "histogram":
            return ("histogram", tuple(sorted(i.lengths.histogram.items())))
        return (i.lengths.dist, i.lengths.low, i.lengths.high)

    def pad_to(i: TensorSpec) -> tuple[int, ...] | None:
        dynamic = [j for j, d in enumerate(i.dims or ()) if d == -1]
        if m.padding is None or not dynamic or not i.max:
            return None
        return tuple(sorted({*m.build.bucket_edges, min(i.max[j] for j in dynamic)}))

    return [InputRule(i.name, i.dtype, tuple(i.dims or ()), t(i.min), t(i.opt), t(i.max), i.stride,
                      None if i.shapes is None else tuple(tuple(s) for s in i.shapes),
                      t(i.values), i.value, lengths(i), pad_to(i),
                      i.pad_value if pad_to(i) and i.pad_value else None) for i in r.inputs]


def _tensor(add, t: TensorSpec, batched: bool) -> None:
    """A rank-0 tensor (a scalar such as a sample rate) is `dims: [1]` to Triton. With a batch axis
    the config reshapes it to [] per sample; without one Triton refuses an empty reshape, and the
    runner turns [1] into rank 0 and back."""
    entry = add(name=t.name, data_type=mc.DataType.Value(f"TYPE_{t.dtype}"), dims=t.dims or [1])
    if not t.dims and batched:
        entry.reshape.SetInParent()


def _warmup_input(rule: InputRule) -> mc.ModelWarmup.Input:
    """Warm-up data that cannot crash a model: integers and booleans are zero (an index within any
    table) unless their `values` exclude zero, floats random; the shape is the one requests use
    most (`opt`, on the stride). A constant `value`, or values without zero, go in as a file."""
    w = mc.ModelWarmup.Input(data_type=mc.DataType.Value(f"TYPE_{rule.dtype}"),
                             dims=list(rule.default_shape()) or [1])
    low, high = rule.values or (0, 0)
    if rule.value is not None or not low <= 0 <= high:
        w.input_data_file = rule.name
    elif rule.dtype in ("FP16", "FP32", "FP64", "BF16"):
        w.random_data = True
    else:
        w.zero_data = True
    return w


def build_config(r: ResolvedModel) -> mc.ModelConfig:
    m = r.spec
    max_batch = m.max_batch_size if r.max_batch_size is None else r.max_batch_size
    cfg = mc.ModelConfig(name=m.name, max_batch_size=max_batch)
    if r.runtime == "python-onnxruntime":
        cfg.backend = "python"
        cfg.parameters["intra_op_threads"].string_value = str(m.threads)
    elif r.runtime == "onnxruntime":
        cfg.platform = "onnxruntime_onnx"
        cfg.parameters["intra_op_thread_count"].string_value = str(m.threads)
    else:
        cfg.platform = "tensorrt_plan"
    for t in r.inputs:
        _tensor(cfg.input.add, t, max_batch > 0)
    for t in r.outputs:
        _tensor(cfg.output.add, t, max_batch > 0)
    rules = input_rules(r)
    cfg.parameters[PARAMETER].string_value = rules_parameter(rules)
    if m.padding is not None and m.padding.crop:
        crop = {name: [c.dim, c.per] for name, c in sorted(m.padding.crop.items())}
        cfg.parameters[CROP_PARAMETER].string_value = json.dumps(crop, separators=(",", ":"))

    set_batching(cfg, m)

    kind = r.kind if m.instances.kind == "auto" else m.instances.kind
    group = cfg.instance_group.add(count=m.instances.count,
                                   kind=mc.ModelInstanceGroup.Kind.Value(f"KIND_{kind.upper()}"))
    group.gpus.extend(m.instances.gpus)
    if r.runtime == "tensorrt":
        group.profile.extend(str(p) for p in r.profiles)
    if m.response_cache:
        cfg.response_cache.enable = True
    if m.warmup:
        # Warm at batch 1 and at the largest batch, so the first full batch in production does
        # not pay the runtime's first-time allocations.
        for size in dict.fromkeys([1, max_batch] if max_batch else [0]):
            w = cfg.model_warmup.add(name=f"warmup_batch_{size}", batch_size=size)
            for rule in rules:
                w.inputs[rule.name].CopyFrom(_warmup_input(rule))
    return cfg


def build_ensemble(p: PipelineSpec, resolved: dict[str, ResolvedModel]) -> mc.ModelConfig:
    """A checked pipeline as Triton's ensemble: its tensors as their first reader (inputs) and
    their writer (outputs) declare them; it batches up to the smallest max batch of its steps (each
    step gets whole batches of the ensemble's requests); the input rules are its readers'."""
    steps = [resolved[s.model] for s in p.steps]
    sizes = [r.spec.max_batch_size if r.max_batch_size is None else r.max_batch_size for r in steps]
    max_batch = min(sizes) if all(sizes) else 0
    cfg = mc.ModelConfig(name=p.name, platform="ensemble", max_batch_size=max_batch)
    inputs, outputs = wires_of(p, {n: (r.inputs, r.outputs) for n, r in resolved.items()})
    rules = []
    for t, model in inputs:
        _tensor(cfg.input.add, t, max_batch > 0)
        own = next(o for s in p.steps if s.model == model for o, w in s.inputs.items() if w == t.name)
        rule = next(x for x in input_rules(resolved[model]) if x.name == own)
        rules.append(dataclasses.replace(rule, name=t.name))
    for t in outputs:
        _tensor(cfg.output.add, t, max_batch > 0)
    cfg.parameters[PARAMETER].string_value = rules_parameter(rules)
    ensemble_steps(cfg, p)
    return cfg


def write_ensemble(p: PipelineSpec, cfg: mc.ModelConfig, out: Path) -> WriteReport:
    """An ensemble's folder: an empty version folder (Triton needs one) and its config."""
    folder = out / p.name
    (folder / VERSION).mkdir(parents=True, exist_ok=True)
    cfg_path = folder / "config.pbtxt"
    changed = [cfg_path] if write_config(cfg, cfg_path) else []
    return WriteReport(p.name, "ensemble", cfg_path, changed)


def render(cfg: mc.ModelConfig) -> str:
    return text_format.MessageToString(cfg)


def write_config(cfg: mc.ModelConfig, path: Path) -> bool:
    """The one writer of a config.pbtxt: rendered from Triton's own schema, atomic, the file it
    replaces kept as `.last-good`. True when it changed."""
    return write_bytes_atomic(path, render(cfg).encode(), keep_previous=True)


def parse(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def runner_source() -> Path:
    return Path(str(importlib.resources.files("tritonkit.configs") / RUNNER_FILE))


def runner_helpers() -> dict[str, Path]:
    """The kit's modules the runner imports, copied beside it: the input rule it checks requests
    with, the ONNX Runtime session it serves with, its optional timing counters (`bench serving`)."""
    return {name: Path(str(importlib.resources.files("tritonkit") / name))
            for name in (RULES_FILE, SESSION_FILE, TIMINGS_FILE)}


@dataclass
class WriteReport:
    model: str
    runtime: str
    config_path: Path
    changed: list[Path]


def write_model(r: ResolvedModel, cfg: mc.ModelConfig, out: Path) -> WriteReport:
    """Version files first, config.pbtxt last: a config never points at files not yet there."""
    folder = out / r.spec.name
    version = folder / VERSION
    changed: list[Path] = []
    if (r.runtime in ("python-onnxruntime", "onnxruntime") or r.on_node) and \
            copy_file_atomic(r.onnx_path, version / "model.onnx"):
        changed.append(version / "model.onnx")
    runner = {"model.py": runner_source(), **runner_helpers()}
    for name, source in runner.items():
        if r.runtime == "python-onnxruntime":
            if copy_file_atomic(source, version / name):
                changed.append(version / name)
        elif (version / name).exists():
            (version / name).unlink()  # a stale runner would mislead whoever reads the folder
            changed.append(version / name)
    rules = {x.name: x for x in input_rules(r)}
    for w in cfg.model_warmup[:1]:
        for name, inp in w.inputs.items():
            if inp.input_data_file:  # one sample; Triton repeats it for a larger warm-up batch
                data = Sampler([rules[name]], batched=False)()[name].tobytes()
                if write_bytes_atomic(folder / "warmup" / inp.input_data_file, data):
                    changed.append(folder / "warmup" / inp.input_data_file)
    cfg_path = folder / "config.pbtxt"
    if write_config(cfg, cfg_path):
        changed.append(cfg_path)
    return WriteReport(r.spec.name, r.runtime, cfg_path, changed)


def _engine_problems(spec: Spec, resolved: list[ResolvedModel], out: Path) -> list[Problem]:
    missing = [Problem(spec.shown, f"models[{spec.models.index(r.spec)}].runtime",
                       f"tensorrt needs the engine {out / r.spec.name / VERSION / 'model.plan'}, which does not exist",
                       "build it first (`tritonkit build`) or set runtime: onnxruntime")
               for r in resolved
               if r.runtime == "tensorrt" and not r.on_node
               and not (out / r.spec.name / VERSION / "model.plan").exists()]
    # The planned max batch must admit the preferred sizes; an engine must fit the spec and this machine
    # (an engine the node builds is checked by the node's build).
    return missing + [p for r in resolved
                      for p in serving_problems(spec, r.spec, out, "onnxruntime" if r.on_node else r.runtime,
                                                r.max_batch_size)]


def generate(spec: Spec, out: Path, target: str | Target = "local",
             models: list[str] | None = None) -> list[WriteReport]:
    """Write the repository folders of a resolved spec (configs.loader; a variant of one is checked
    here first): its models, and its pipelines where every model is written (`models` None).
    Every config is built in memory before the disk is touched. Behind the gateway, the queues are
    written as `configs.gateway.queues_behind` says."""
    spec = behind_gateway(spec)
    if not spec.checked:
        check(spec)  # a variant (the tuner's, the sweep's): every rule again, nothing parsed
    out = Path(out)
    chosen = [spec.model(n) for n in models] if models else spec.models
    resolved = [resolve(spec, m, target, out) for m in chosen]
    problems = _engine_problems(spec, resolved, out)
    if problems:
        raise InputError(problems)
    configs = [build_config(r) for r in resolved]
    by_name = {r.spec.name: r for r in resolved}
    ensembles = [(p, build_ensemble(p, by_name)) for p in spec.pipelines] if models is None else []
    return [write_model(r, cfg, out) for r, cfg in zip(resolved, configs)] + \
        [write_ensemble(p, cfg, out) for p, cfg in ensembles]
