"""The engine build a node runs: the kit's plan (profiles, memory bound, precision) as trtexec flags.

The plan is made where the kit runs (`tritonkit build` prepares, verifies and plans each model
without a GPU); only the build runs on the node, by the TensorRT that serves the engine
(helm/triton-edge/files/build_engines.py). The flags mirror `trt_build.build_engine`: one
optimization profile per planned profile, the workspace limit, the optimization level, the
precision and hardware compatibility.
"""

from __future__ import annotations

from pathlib import Path

from tritonkit.errors import InputError, Problem
from tritonkit.spec import BuildSpec, Spec

from . import artifacts
from .load import sha256_file
from .plan import model_at

HARDWARE_COMPAT = {"none": None, "ampere_plus": "ampere+"}
PRECISION = {"fp16": ["--fp16"], "fp32": ["--noTF32"], "tf32": []}  # TensorRT 10 enables TF32 by default


def _name(tensor: str) -> str:
    return f"'{tensor}'" if any(c in tensor for c in ":,'") else tensor


def _shapes(profile: dict, point: str) -> str:
    return ",".join(f"{_name(name)}:{'x'.join(str(d) for d in r[point])}" for name, r in profile.items())


def trtexec_args(plan: dict, b: BuildSpec) -> list[str]:
    """trtexec's flags for a planned model (`Plan.to_json()`): repeated shape triples are TensorRT's
    way of asking for one optimization profile each."""
    args = []
    for profile in plan["profiles"]:
        args += [f"--minShapes={_shapes(profile, 'min')}", f"--optShapes={_shapes(profile, 'opt')}",
                 f"--maxShapes={_shapes(profile, 'max')}"]
    if b.workspace_mb:
        args.append(f"--memPoolSize=workspace:{b.workspace_mb}M")
    args.append(f"--builderOptimizationLevel={b.optimization_level}")
    args += PRECISION[b.precision]
    if HARDWARE_COMPAT.get(b.hardware_compat):
        args.append(f"--hardwareCompatibilityLevel={HARDWARE_COMPAT[b.hardware_compat]}")
    return args


def node_plan_problems(spec: Spec, models: list[str]) -> list[Problem]:
    return [Problem(spec.shown, f"{model_at(spec, m)}.build.hardware_compat",
                    f"{m.build.hardware_compat} has no trtexec flag for a build on the node",
                    "set build.hardware_compat: none or ampere_plus")
            for m in spec.models if m.name in models and m.build.hardware_compat not in HARDWARE_COMPAT]


def node_plan(spec: Spec, repo: Path, models: list[str], tensorrt: str | None) -> dict:
    """What the node's build container reads: per model, the digest of the ONNX it builds from (the
    version folder's model.onnx, which `configs` wrote from the prepared graph) and the flags."""
    entries = []
    for name in models:
        m = spec.model(name)
        record = artifacts.read_record(repo, name)
        onnx = repo / name / "1" / "model.onnx"
        if not record or not onnx.exists():
            raise InputError([Problem(spec.shown, model_at(spec, m), f"{name} has no plan in {repo}",
                                      "run `tritonkit build` first (`tritonkit deploy` does), then deploy")])
        entries.append({"name": name, "sha256": sha256_file(onnx), "args": trtexec_args(record["plan"], m.build)})
    return {"format": 1, "tensorrt": tensorrt, "models": entries}
