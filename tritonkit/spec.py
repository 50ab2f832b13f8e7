"""deploy.yaml: the one hand-written input. Parsed into typed models, every problem reported.

Structure and types are checked here (pydantic). Rules that tie several fields together, and
Triton's own load-time rules, live in `tritonkit.configs.rules`; what the ONNX graph says lives
in `tritonkit.onnx_io`. `tritonkit.configs.loader.load_spec` runs all three and raises one
InputError listing everything; it is called once per command, at the command boundary
(ARCHITECTURE.md), and every stage takes the Spec it returns.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tritonkit.errors import InputError, Problem

# Triton's data type names without the TYPE_ prefix (model_config.proto DataType).
DType = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BF16", "STRING",
]
Runtime = Literal["auto", "tensorrt", "onnxruntime", "python-onnxruntime"]
# Written by `tritonkit tune` beside deploy.yaml; overrides these keys of the models it names.
TUNED_FILE = "tuned.yaml"
TUNED_KEYS = ("max_batch_size", "batching", "instances", "admission", "build")
TUNED_BUILD_KEYS = ("bucket_edges",)  # of `build`, what a tune chooses
# Set to a file path, every parse appends one line to it (the parse-count test reads it).
TRACE_ENV = "TRITONKIT_TRACE_PARSES"


class _Strict(BaseModel):
    # Unknown keys are errors: a typo such as `max_queue_delay_ms` must not be silently ignored.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Lengths(_Strict):
    """How long requests are along an input's dynamic dims (every one of them takes the drawn
    length, the convention `build.bucket_edges` cuts by too): uniform or log-uniform between `low`
    and `high` inclusive, or a `histogram` of length -> weight (from real traffic). Drawn lengths
    land on the input's stride."""

    dist: Literal["uniform", "loguniform", "histogram"] = "uniform"
    low: int | None = Field(None, ge=1)
    high: int | None = Field(None, ge=1)
    histogram: dict[int, float] | None = Field(None, min_length=1)


class CropSpec(_Strict):
    """An output dim that follows the padded input length: it is cut back to ceil(length / per)
    for the request's own length (a recogniser's time steps after a stride-4 downsampling: per 4)."""

    dim: int = Field(ge=0)  # per sample, no batch axis
    per: int = Field(1, ge=1)


class PaddingSpec(_Strict):
    """Requests padded where they are made, up to the next of `build.bucket_edges` (else the max)
    along the dynamic dims, so that the server sees a few shapes and the batcher can fill batches."""

    crop: dict[str, CropSpec] = Field(default_factory=dict)  # output name -> the dim to cut back


class TensorSpec(_Strict):
    """One input or output. `dims` are per sample (no batch axis); -1 marks a dynamic dim."""

    name: str = Field(min_length=1)
    dtype: DType | None = None
    dims: list[int] | None = None
    # Shape range per sample for dynamic dims (used for engine profiles and load generation).
    min: list[int] | None = None
    opt: list[int] | None = None
    max: list[int] | None = None
    # What generated requests carry (tritonkit/inputs.py): dynamic dims on multiples of `stride`,
    # or one of `shapes` (per sample); integer/bool data within `values` [low, high] (inclusive,
    # uniform in it for floats), or `value` for an input that must be a constant (a sample rate).
    stride: int | None = Field(None, ge=1)
    shapes: list[list[int]] | None = Field(None, min_length=1)
    values: tuple[float, float] | None = None
    value: float | None = None
    lengths: Lengths | None = None  # what traffic sends along the dynamic dims; default: opt
    pad_value: float = 0.0  # what padding fills with (0 also for a mask: padding is not attended)


class QueuePolicy(_Strict):
    """Triton's ModelQueuePolicy: what happens to a request that waits too long or finds the queue full."""

    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_us: int = Field(0, ge=0)  # 0 = requests never time out in the queue
    allow_timeout_override: bool = False
    max_queue_size: int = Field(0, ge=0)  # 0 = unbounded


class Batching(_Strict):
    """Triton's dynamic_batching block."""

    enabled: bool = True
    preferred_batch_sizes: list[int] = Field(default_factory=list)
    max_queue_delay_us: int = Field(0, ge=0)
    priority_levels: int = Field(0, ge=0)
    default_priority: int = Field(0, ge=0)
    default_queue_policy: QueuePolicy | None = None
    priority_queue_policies: dict[int, QueuePolicy] = Field(default_factory=dict)
    preserve_ordering: bool = False


class Instances(_Strict):
    kind: Literal["auto", "cpu", "gpu"] = "auto"
    count: int = Field(1, ge=1)
    gpus: list[int] = Field(default_factory=list)


class Slo(_Strict):
    p95_ms: float | None = Field(None, gt=0)
    rps: float | None = Field(None, gt=0)


class BuildSpec(_Strict):
    """`tritonkit build`: verification tolerances, profile planning and TensorRT builder options."""

    atol: float = Field(1e-3, ge=0)  # prepared graph / engine vs ONNX Runtime on the original
    rtol: float = Field(1e-3, ge=0)
    opt_batch: int | None = Field(None, ge=1)  # default: the largest preferred batch size, else the max
    safety_factor: float = Field(1.5, ge=1)  # on activation memory (ARCHITECTURE.md: 1.5 to 2)
    precision: Literal["fp32", "tf32", "fp16"] = "fp32"  # fp16 needs TensorRT 10 (11 takes it from the graph)
    workspace_mb: int | None = Field(None, ge=1)  # None = TensorRT's default (the device's memory)
    optimization_level: int = Field(3, ge=0, le=5)
    hardware_compat: Literal["none", "ampere_plus", "same_compute_capability"] = "none"
    # Upper edges that split every dynamic per-sample dim into length buckets, one profile each.
    bucket_edges: list[int] = Field(default_factory=list)


class Admission(_Strict):
    """How many of the model's requests the gateway lets in flight at once (`server.gateway`):
    `tritonkit tune` writes it from its claim (Little's law: the claimed rate times the P95 measured
    there), beside the batching it tuned."""

    max_in_flight: int | None = Field(None, ge=1)


class ModelSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
    onnx: Path
    inputs: list[TensorSpec] | None = None  # read from the ONNX graph when omitted
    outputs: list[TensorSpec] | None = None
    max_batch_size: int = Field(8, ge=0)  # 0 = the model has no batch axis
    runtime: Runtime = "auto"
    batching: Batching = Field(default_factory=Batching)
    instances: Instances = Field(default_factory=Instances)
    response_cache: bool = False
    warmup: bool = True
    threads: int = Field(1, ge=1)  # ONNX Runtime intra-op threads per instance
    slo: Slo = Field(default_factory=Slo)
    memory_budget_mb: float | None = Field(None, gt=0)
    build: BuildSpec = Field(default_factory=BuildSpec)
    admission: Admission = Field(default_factory=Admission)
    padding: PaddingSpec | None = None  # None: every length is its own shape


class PipelineStep(_Strict):
    """One model of a pipeline and the tensors it reads and writes, as Triton's ensemble steps map
    them: the model's own tensor name -> the pipeline's tensor name."""

    model: str
    inputs: dict[str, str] = Field(min_length=1)
    outputs: dict[str, str] = Field(min_length=1)


class PipelineSpec(_Strict):
    """A chain (or tree) of the spec's models served as one Triton ensemble. `inputs` are the
    pipeline tensors a client sends, `outputs` the ones it gets back; each step's maps name them."""

    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
    inputs: list[str] = Field(min_length=1)
    outputs: list[str] = Field(min_length=1)
    steps: list[PipelineStep] = Field(min_length=1)
    slo: Slo = Field(default_factory=Slo)


class RestrictedKey(_Strict):
    """The header that guards the model-repository API (load/unload). The value comes from the
    environment, never from this file, so a spec can be committed without a secret in it."""

    header: str = Field("tritonkit-key", pattern=r"^[A-Za-z0-9-]+$")
    value_env: str = "TRITONKIT_API_KEY"


class GatewaySpec(_Strict):
    """Envoy in front of Triton's gRPC port (`configs/gateway.py`): a bounded number of requests in
    flight, the rest refused at once; interactive requests on a threshold of their own."""

    enabled: bool = False
    port: int = Field(0, ge=0, le=65535)  # where gRPC clients connect (0 = a free port)
    admin_port: int = Field(0, ge=0, le=65535)
    # None: the sum of the served models' admission.max_in_flight (what `tune` wrote)
    max_in_flight: int | None = Field(None, ge=1)
    interactive_share: float = Field(0.25, ge=0, le=1)  # of the limit, on the HIGH threshold
    # Envoy's adaptive concurrency filter in front of the fixed limit, steered by the tightest SLO:
    # under 1.5-3x the claim it kept 0.56-0.84 of it where the fixed limit alone kept 0.00-0.58
    # (docs/overload.md); off, the limit alone bounds what is in flight
    adaptive: bool = True
    timeout_ms: float | None = Field(None, gt=0)  # the deadline; None: the tightest SLO where it is safe
    # Behind the gateway each model keeps priority levels and no queue policy (`configs.gateway.
    # queues_behind`): Envoy bounds the wait, Triton orders it. With the policies kept, Triton's queue
    # refused first, in its 78 ms timeout at 1.5x the claim, where Envoy refused in 5 ms (docs/overload.md)
    keep_queue_policies: bool = False


class ServerSpec(_Strict):
    host: str = "127.0.0.1"
    http_port: int = Field(8000, ge=0, le=65535)  # 0 = pick a free port
    grpc_port: int = Field(8001, ge=0, le=65535)
    metrics_port: int = Field(8002, ge=0, le=65535)
    restricted_key: RestrictedKey = Field(default_factory=RestrictedKey)
    response_cache_mb: int = Field(64, ge=1)
    startup_timeout_s: float = Field(120, gt=0)
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)


_K8S_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # a DNS label, as Kubernetes names must be


class DeployEngines(_Strict):
    """Where the pod finds each model's version folder (<model>/1/model.plan or model.onnx)."""

    source: Literal["hostPath", "pvc", "fetch"] = "hostPath"
    host_path: str | None = Field(None, pattern=r"^/")  # default: this machine's generated repository
    pvc: str | None = Field(None, pattern=_K8S_NAME)  # an existing claim; unset creates one
    pvc_size: str = Field("10Gi", pattern=r"^[0-9]+(Ki|Mi|Gi|Ti)$")
    url: str | None = Field(None, pattern=r"^https?://")  # archive with <model>/1/... folders
    # Unset: deploy writes the archive itself (helm/bundle.py) and pins its digest.
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$")
    upload: bool = False  # deploy PUTs the archive it wrote to `url`


class DeployAutoscaling(_Strict):
    enabled: bool = False
    min_replicas: int = Field(1, ge=1)
    max_replicas: int = Field(3, ge=1)
    metric: Literal["queue_time", "cpu"] = "queue_time"
    target_queue_us: int | None = Field(None, gt=0)  # default: a quarter of the tightest P95 SLO
    target_cpu_percent: int = Field(80, ge=1, le=100)


class DeployLocust(_Strict):
    enabled: bool = False
    workers: int = Field(2, ge=0)
    model: str | None = None  # default: the first model


class DeploySettings(_Strict):
    """`tritonkit deploy`: the Helm release, and the chart values that deploy.yaml decides."""

    release: str = Field("triton-edge", max_length=53, pattern=_K8S_NAME)
    namespace: str = Field("triton", max_length=63, pattern=_K8S_NAME)
    platform: Literal["x86", "sbsa", "jetson"] = "x86"  # the node: tritonkit/support.py (the support matrix)
    triton_version: str = Field("24.10", pattern=r"^[0-9]{2}\.[0-9]{2}$")  # NGC release YY.MM
    gpus: int = Field(1, ge=0)
    runtime_class: str | None = None  # default: `nvidia` on jetson, none on x86
    replicas: int = Field(1, ge=1)
    node_selector: dict[str, str] = Field(default_factory=dict)
    engines: DeployEngines = Field(default_factory=DeployEngines)
    kit_image: str | None = None  # image with the kit installed (tuner, Locust): registry/repo:tag
    tuner: bool = False
    locust: DeployLocust = Field(default_factory=DeployLocust)
    autoscaling: DeployAutoscaling = Field(default_factory=DeployAutoscaling)
    service_monitor: bool = False
    values: dict[str, object] = Field(default_factory=dict)  # any chart value, merged last


class DeploySpec(_Strict):
    models: list[ModelSpec] = Field(min_length=1)
    pipelines: list[PipelineSpec] = Field(default_factory=list)
    # The box's traffic mix: requests per second per model or pipeline, as they arrive together;
    # `tritonkit tune --mix` finds the configs that hold every SLO at the highest scale of it.
    traffic: dict[str, float] = Field(default_factory=dict)
    server: ServerSpec = Field(default_factory=ServerSpec)
    deploy: DeploySettings = Field(default_factory=DeploySettings)


class Spec:
    """A validated spec plus where it came from (relative ONNX paths resolve against its folder)."""

    def __init__(self, data: DeploySpec, path: Path, shown: str | None = None, source: dict | None = None):
        self.data = data
        self.path = path
        self.shown = shown or str(path)  # the path as the user wrote it, for messages
        self.source = source  # deploy.yaml as written (no tuned.yaml overlay), for the tuner sidecar's copy
        # True once configs.loader has checked every rule on exactly this object; a derived spec
        # (with_model) starts unchecked, so a variant is always checked before it is written.
        self.checked = False

    @property
    def models(self) -> list[ModelSpec]:
        return self.data.models

    @property
    def server(self) -> ServerSpec:
        return self.data.server

    @property
    def pipelines(self) -> list[PipelineSpec]:
        return self.data.pipelines

    @property
    def traffic(self) -> dict[str, float]:
        return self.data.traffic

    def slo_of(self, name: str) -> Slo:
        p = self.pipeline(name)
        return p.slo if p is not None else self.model(name).slo

    def pipeline(self, name: str) -> PipelineSpec | None:
        """The pipeline of that name, None when `name` is not one (a model's name, or unknown)."""
        return next((p for p in self.pipelines if p.name == name), None)

    def served(self) -> list[str]:
        """Every name a client can send requests to: the models, then the pipelines."""
        return [m.name for m in self.models] + [p.name for p in self.pipelines]

    def steps_of(self, name: str) -> list[str]:
        """The models a served name runs: a pipeline's step models, in order, each once; a model alone.
        An unknown name is an InputError listing the known ones."""
        p = self.pipeline(name)
        if p is not None:
            return list(dict.fromkeys(s.model for s in p.steps))
        if name not in self.served():
            raise InputError([Problem(self.shown, "models", f"no model or pipeline named {name!r}",
                                      f"use one of: {', '.join(self.served())}")])
        return [name]

    def with_steps(self, names: list[str]) -> list[str]:
        """`names` in load order: each pipeline after the models it runs."""
        return list(dict.fromkeys(n for name in names for n in [*self.steps_of(name), name]))

    def onnx_path(self, model: ModelSpec) -> Path:
        return model.onnx if model.onnx.is_absolute() else (self.path.parent / model.onnx)

    def with_model(self, model: ModelSpec) -> Spec:
        """A copy of this spec with one model (matched by name) replaced."""
        models = [model if m.name == model.name else m for m in self.models]
        return Spec(self.data.model_copy(update={"models": models}), self.path, self.shown, self.source)

    def as_written(self) -> Spec:
        """deploy.yaml without the tuned.yaml overlay (validated from what was read, nothing re-read)."""
        if self.source is None:
            return self
        return Spec(DeploySpec.model_validate(copy.deepcopy(self.source)), self.path, self.shown, self.source)

    def model(self, name: str) -> ModelSpec:
        for m in self.models:
            if m.name == name:
                return m
        known = ", ".join(m.name for m in self.models)
        raise InputError([Problem(self.shown, "models", f"no model named {name!r}",
                                  f"use one of: {known}")])


def format_loc(loc: tuple) -> str:
    """('models', 0, 'batching', 'preferred_batch_sizes', 1) -> models[0].batching.preferred_batch_sizes[1]"""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _pydantic_problems(file: str, err: ValidationError) -> list[Problem]:
    problems = []
    for e in err.errors():
        path = format_loc(e["loc"])
        kind = e["type"]
        if kind == "extra_forbidden":
            problems.append(Problem(file, path, "unknown key",
                                    "remove it or check its spelling against docs/deploy-yaml.md"))
        elif kind == "missing":
            problems.append(Problem(file, path, "required key is missing", "add it"))
        elif kind == "literal_error":
            problems.append(Problem(file, path, f"{e['input']!r} is not allowed",
                                    f"use {e['ctx']['expected']}"))
        else:
            problems.append(Problem(file, path, f"{e['input']!r}: {e['msg'].lower()}"))
    return problems


_parses = 0


def parse_count() -> int:
    """How many times this process parsed a spec (one per command: the parse-count test)."""
    return _parses


def parse_spec(path: Path) -> Spec:
    """Read and type-check deploy.yaml, tuned.yaml overlaid. Raises InputError; never returns a
    half-valid spec. The one place a spec file is read: commands call it through configs.loader."""
    global _parses
    _parses += 1
    if os.environ.get(TRACE_ENV):
        with open(os.environ[TRACE_ENV], "a") as trace:
            trace.write(f"{path}\n")
    path = Path(path)
    file = str(path)
    if not path.is_file():
        raise InputError([Problem(file, "", "spec file not found",
                                  "pass --spec with the path of your deploy.yaml")])
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputError([Problem(file, where, f"not valid YAML: {getattr(e, 'problem', e)}",
                                  "fix the YAML syntax")]) from None
    if not isinstance(raw, dict):
        raise InputError([Problem(file, "", "expected a mapping with a `models:` list at the top",
                                  "see docs/deploy-yaml.md")])
    source = copy.deepcopy(raw)
    _apply_tuned(raw, path.parent / TUNED_FILE)
    try:
        data = DeploySpec.model_validate(raw)
    except ValidationError as e:
        raise InputError(_pydantic_problems(file, e)) from None
    return Spec(data, path.resolve(), shown=file, source=source)


def _apply_tuned(raw: dict, tuned: Path) -> None:
    """Overlay the tuner's decisions (tuned.yaml) on the models they name, key by key."""
    if not tuned.is_file():
        return
    file = str(tuned)
    fix = f"delete {tuned.name} (or the entry) and re-run `tritonkit tune`"
    try:
        data = yaml.safe_load(tuned.read_text())
    except yaml.YAMLError as e:
        raise InputError([Problem(file, "", f"not valid YAML: {getattr(e, 'problem', e)}", fix)]) from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        raise InputError([Problem(file, "models", "expected a mapping of model names to tuned keys", fix)])
    by_name = {m.get("name"): m for m in raw.get("models") or [] if isinstance(m, dict)}
    problems = []
    for name, keys in data["models"].items():
        if name not in by_name:
            problems.append(Problem(file, f"models.{name}", "no model of that name in the spec", fix))
        elif not isinstance(keys, dict) or set(keys) - set(TUNED_KEYS):
            problems.append(Problem(file, f"models.{name}", f"only {', '.join(TUNED_KEYS)} can be tuned", fix))
        elif not isinstance(keys.get("build", {}), dict) or set(keys.get("build", {})) - set(TUNED_BUILD_KEYS):
            problems.append(Problem(file, f"models.{name}.build",
                                    f"only build.{', build.'.join(TUNED_BUILD_KEYS)} can be tuned", fix))
        else:
            model = by_name[name]
            for key, value in keys.items():
                base = model.get(key)
                model[key] = {**base, **value} if isinstance(base, dict) and isinstance(value, dict) else value
    if problems:
        raise InputError(problems)
