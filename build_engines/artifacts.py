"""What `tritonkit build` leaves in the repository, and what `configs` reads back from it.

    <repo>/<model>/build/model.onnx   the prepared graph (Triton ignores non-numeric folders)
    <repo>/<model>/build/build.json   metadata: source hash, plan, verification, engine facts
    <repo>/<model>/1/model.plan       the TensorRT engine (GPU machines only)

`configs.loader` swaps the prepared graph in (prepared_spec); `configs` copies it into the
version folder, takes max_batch_size and the profile mapping from the plan, and refuses an
engine that does not fit the spec or this machine.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from tritonkit.errors import Problem
from tritonkit.spec import ModelSpec, Spec

from .gpu import Target, target
from .load import sha256_file
from .plan import serving_max_batch

FORMAT = 1  # bump when prepare/plan change what they produce, so old builds are redone
BUILD_DIR = "build"
RECORD = "build.json"
PREPARED = "model.onnx"
ENGINE = "model.plan"
VERSION = "1"


def build_dir(out: Path, model: str) -> Path:
    return Path(out) / model / BUILD_DIR


def engine_path(out: Path, model: str) -> Path:
    return Path(out) / model / VERSION / ENGINE


def read_record(out: Path, model: str) -> dict | None:
    path = build_dir(out, model) / RECORD
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # no build, or a damaged record: either way, not something to trust


@functools.lru_cache(maxsize=32)
def _sha(path: str, mtime_ns: int, size: int) -> str:
    return sha256_file(Path(path))


def source_sha(path: Path) -> str:
    st = Path(path).stat()
    return _sha(str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


def build_key(source_sha256: str, m: ModelSpec, target: Target) -> str:
    """Everything the build's outputs depend on. Equal key: nothing to rebuild."""
    parts = {
        "format": FORMAT,
        "source": source_sha256,
        "max_batch_size": m.max_batch_size,
        "inputs": [t.model_dump(mode="json") for t in m.inputs or []],
        "memory_budget_mb": m.memory_budget_mb,
        "instances": m.instances.count,
        "preferred": m.batching.preferred_batch_sizes,
        "build": m.build.model_dump(mode="json"),
        "trt": target.trt_version if target.reason is None else None,
        "gpu": (target.gpu.name, target.gpu.compute_capability) if target.gpu and target.reason is None else None,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def is_current(record: dict | None, key: str, out: Path, model: str) -> bool:
    """The record matches the key and the files it describes are still the ones it wrote."""
    if not record or record.get("key") != key:
        return False
    prepared = build_dir(out, model) / PREPARED
    if not prepared.is_file() or sha256_file(prepared) != record["prepared"]["sha256"]:
        return False
    engine = record.get("engine")
    if engine:
        path = engine_path(out, model)
        return path.is_file() and sha256_file(path) == engine["sha256"]
    return True


def prepared_spec(spec: Spec, out: Path) -> Spec:
    """The spec with each model that `tritonkit build` prepared (from the same ONNX, with the same
    batch setting) pointing at the prepared graph, so configs serve what was verified."""
    for m in spec.models:
        record = read_record(out, m.name)
        prepared = build_dir(out, m.name) / PREPARED
        source = spec.onnx_path(m)
        if (record and prepared.is_file() and source.is_file() and record.get("batched") == (m.max_batch_size > 0)
                and record.get("source", {}).get("sha256") == source_sha(source)):
            spec = spec.with_model(m.model_copy(update={"onnx": prepared.resolve()}))
    return spec


def engine_mismatch(engine: dict, target: Target) -> str | None:
    """Why an engine cannot run on `target` (None when it can, or when the target is unknown here)."""
    if target.trt_version and engine.get("trt_version") != target.trt_version:
        return (f"it was built with TensorRT {engine.get('trt_version')}, this machine has {target.trt_version} "
                "(engines only load in the TensorRT version that built them)")
    gpu = target.gpu
    if gpu is None:
        return None
    compat = engine.get("hardware_compat", "none")
    if compat == "ampere_plus":
        ok = float(gpu.compute_capability) >= 8.0
    else:  # same compute capability; without a compatibility level TensorRT also wants the same model
        ok = engine.get("compute_capability") == gpu.compute_capability
        if ok and compat == "none":
            ok = engine.get("gpu_name") == gpu.name
    if not ok:
        return (f"it was built for {engine.get('gpu_name')} (compute capability {engine.get('compute_capability')}, "
                f"hardware_compat {compat}), this machine has {gpu.name} ({gpu.compute_capability})")
    return None


def serving_batch(spec: Spec, m: ModelSpec, out: Path | None, runtime: str,
                  planned: bool = False) -> tuple[int, tuple[int, ...]]:
    """max_batch_size and the instance-group profile list for `configs`: the plan's max batch,
    or, for a TensorRT model whose engine was built for this spec, the engine's profile max. With
    `planned` the engine is built on the node from the plan: the plan's profiles."""
    max_batch = serving_max_batch(spec, m)
    record = read_record(out, m.name) if out is not None and runtime == "tensorrt" else None
    if record and planned:
        n = len(record["plan"]["profiles"])
        return max_batch, tuple(range(n)) if n > 1 else ()
    if not record or not record.get("engine"):
        return max_batch, ()
    n = len(record["plan"]["profiles"])
    engine_max = record["plan"]["max_batch"]
    if m.max_batch_size and engine_max < max_batch and _fresh(record, spec, m, out):
        max_batch = engine_max  # TensorRT's own device memory lowered it at build time
    return max_batch, tuple(range(n)) if n > 1 else ()


def _source_sha(spec: Spec, m: ModelSpec, out: Path, record: dict) -> str | None:
    path = spec.onnx_path(m)
    if path.resolve() == (build_dir(out, m.name) / PREPARED).resolve():
        return record["source"]["sha256"]  # prepared_spec swapped it in after checking the source
    return source_sha(path) if path.is_file() else None


def _fresh(record: dict, spec: Spec, m: ModelSpec, out: Path) -> bool:
    return record.get("key") == build_key(_source_sha(spec, m, out, record) or "", m, target())


def serving_problems(spec: Spec, m: ModelSpec, out: Path, runtime: str, max_batch: int) -> list[Problem]:
    """Before configs are written: the planned max batch still admits the preferred sizes, and a
    TensorRT engine matches the ONNX, the batch range and this machine."""
    at = f"models[{[x.name for x in spec.models].index(m.name)}]"
    problems = []
    over = [s for s in m.batching.preferred_batch_sizes if s > max_batch]
    if m.batching.enabled and over and max_batch < m.max_batch_size:
        problems.append(Problem(spec.shown, f"{at}.memory_budget_mb",
                                f"bounds the max batch to {max_batch}, below preferred_batch_sizes {over}",
                                "raise memory_budget_mb, or lower the preferred sizes"))
    record = read_record(out, m.name)
    fix = "rebuild it: `tritonkit build` (or `make engines`) on the target machine"
    if runtime == "tensorrt" and record and not record.get("engine") and engine_path(out, m.name).is_file():
        problems.append(Problem(spec.shown, f"{at}.runtime",
                                f"refusing to deploy {engine_path(out, m.name)}: the last build did not make it "
                                f"({record.get('engine_skipped')})", fix))
    if runtime != "tensorrt" or not record or not record.get("engine"):
        return problems
    engine = record["engine"]
    where = engine_path(out, m.name)
    if record.get("source", {}).get("sha256") != _source_sha(spec, m, out, record):
        problems.append(Problem(spec.shown, f"{at}.onnx", f"the engine {where} was built from a different ONNX", fix))
    if m.max_batch_size and record["plan"]["max_batch"] < max_batch:
        problems.append(Problem(spec.shown, f"{at}.max_batch_size",
                                f"{max_batch} is above the engine's profile max {record['plan']['max_batch']} "
                                f"({where}); Triton would refuse the model", fix))
    why = engine_mismatch(engine, target())
    if why:
        problems.append(Problem(spec.shown, f"{at}.runtime", f"refusing to deploy {where}: {why}", fix))
    return problems
