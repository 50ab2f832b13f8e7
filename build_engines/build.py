"""`tritonkit build`: per model, prepare -> plan -> verify -> engine -> record. It returns what it
built; the caller writes the configs from it (`configs.steps`), so data flows one way.

Everything is computed in memory first; files are written atomically at the end of each model,
the record last, so an interrupted or failed build leaves the previous build intact (or none)
and the next run redoes it. An unchanged build key skips the model without touching a file.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import onnx

from tritonkit.errors import InputError, KitError, Problem
from tritonkit.files import write_bytes_atomic
from tritonkit.onnx_io import ONNX_TO_TRITON, GraphIO, GraphTensor, check_against_graph
from tritonkit.spec import ModelSpec, Spec

from . import artifacts
from .gpu import Target, target
from .load import load_model, sha256_file
from .plan import MIB, Plan, make_plan, model_at
from .prepare import REFUSE_FIX, prepare
from .trt_build import EngineBuildError, build_engine, verify_engine
from .verify import VerifyError, rules_of, summary, verify_prepared

DEFAULT_CACHE = Path(".tritonkit/trt-cache")  # outside the repository: Triton would take a folder there for a model


FAILED = "failed"


@dataclass
class ModelResult:
    name: str
    status: str  # built | prepared (no engine) | unchanged | failed
    max_batch: int
    bounded_by: str
    profiles: int
    verify: str
    engine: str  # "model.plan (12.3 s)" or why not
    runtime: str = ""
    problems: list[Problem] = field(default_factory=list)  # why it failed, each naming the model
    input_error: bool = False  # the failure is the user's to fix (exit 2), not a runtime one (exit 1)
    reason: str = ""  # the first line of why it failed, for the table

    @property
    def failed(self) -> bool:
        return self.status == FAILED


ON_NODE = "engines are built on the node, by the TensorRT that serves them"


def build(spec: Spec, out: Path, models: list[str] | None = None, cache_dir: Path = DEFAULT_CACHE,
          force: bool = False, log=print, engines: bool = True) -> list[ModelResult]:
    """Build each chosen model of a parsed spec (its rules checked without the ONNX graphs: a
    batch-1 export is fine here, the graphs are checked against what `prepare` makes of them).

    A model that cannot be built is a `failed` result, logged, and the others go on; nothing of
    it is written. The caller reports the results, then `raise_failures`. Without `engines` every
    model is prepared, verified and planned, and no engine is built here (a deploy: the node builds)."""
    chosen = [spec.model(n) for n in models] if models else spec.models
    here = target() if engines else Target(None, None, ON_NODE)
    results = []
    for k, m in enumerate(chosen, 1):
        prefix = f"[{k}/{len(chosen)}] {m.name}"
        try:
            results.append(build_model(spec, m, Path(out), here, Path(cache_dir), force, log, prefix))
        except KitError as e:
            failed = _failed(spec, m, e)
            log(f"{prefix}: failed: {failed.reason}")
            results.append(failed)
    return results


def _failed(spec: Spec, m: ModelSpec, e: KitError) -> ModelResult:
    if isinstance(e, InputError):
        found = e.problems
    else:
        found = [Problem(spec.shown, model_at(spec, m), str(e).strip() or type(e).__name__)]
    problems = [Problem(p.file, p.path, f"model {m.name!r}: {p.message}", p.fix) for p in found]
    reason = f"{found[0].path}: {found[0].message}".splitlines()[0] if found else type(e).__name__
    return ModelResult(m.name, FAILED, 0, "-", 0, "-", "-", problems=problems, input_error=isinstance(e, InputError),
                       reason=reason)


def raise_failures(results: list[ModelResult]) -> None:
    """After the summary: one error listing every failed model's problems (InputError, exit 2, when
    any of them is the user's to fix; else a runtime KitError, exit 1)."""
    failed = [r for r in results if r.failed]
    if not failed:
        return
    problems = [p for r in failed for p in r.problems]
    if any(r.input_error for r in failed):
        raise InputError(problems)
    raise KitError("\n".join(str(p) for p in problems))


def build_model(spec: Spec, m: ModelSpec, out: Path, here: Target, cache_dir: Path, force: bool, log,
                prefix: str) -> ModelResult:
    file, at = spec.shown, model_at(spec, m)
    source = spec.onnx_path(m)
    original = load_model(source, file, f"{at}.onnx")  # a missing or corrupt file stops here, nothing written
    key = artifacts.build_key(artifacts.source_sha(source), m, here)
    record = artifacts.read_record(out, m.name)
    if not force and artifacts.is_current(record, key, out, m.name):
        log(f"{prefix}: unchanged (build key {key[:12]}), skipped")
        return _result_from(record, "unchanged")

    t0 = time.perf_counter()
    log(f"{prefix}: prepare {source.name} ...")
    batched = m.max_batch_size > 0
    prepared = prepare(original, batched, file, at)
    _check_io(file, at, m, prepared.model)
    plan = make_plan(spec, m, prepared.model)
    log(f"{prefix}: prepared ({'; '.join(prepared.changes)}); plan: {_plan_line(plan)}")
    for note in plan.notes:
        log(f"{prefix}:   {note}")

    checks = _verify(file, at, m, original, prepared, plan)
    log(f"{prefix}: verified against the original with ONNX Runtime: {summary(checks)}")

    prepared_bytes = prepared.model.SerializeToString()
    engine_meta, engine_bytes, skipped = None, None, None
    if here.reason is not None or m.runtime not in ("auto", "tensorrt"):
        skipped = here.reason or f"runtime: {m.runtime} needs no engine"
        then = ("the deploy's configs name the engine the node builds" if skipped == ON_NODE
                else "configs serve the prepared ONNX with ONNX Runtime")
        log(f"{prefix}: engine build skipped: {skipped}; {then}")
    else:
        plan, engine_bytes, engine_meta = _engine(spec, m, prepared, prepared_bytes, plan, here, cache_dir, log,
                                                  prefix)

    # Outputs: graph, engine, then the record that vouches for both.
    bdir = artifacts.build_dir(out, m.name)
    write_bytes_atomic(bdir / artifacts.PREPARED, prepared_bytes)
    if engine_bytes is not None:
        write_bytes_atomic(artifacts.engine_path(out, m.name), engine_bytes)
    record = {
        "format": artifacts.FORMAT,
        "model": m.name,
        "key": key,
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "batched": batched,
        "source": {"path": str(source), "sha256": artifacts.source_sha(source)},
        "prepared": {"file": f"{artifacts.BUILD_DIR}/{artifacts.PREPARED}",
                     "sha256": sha256_file(bdir / artifacts.PREPARED),
                     "static_batch_made_dynamic": prepared.static_batch, "changes": prepared.changes},
        "plan": plan.to_json(),
        "verify": {"atol": m.build.atol, "rtol": m.build.rtol,
                   "checks": [{"at": c.label, "shapes": {k: list(v) for k, v in c.shapes.items()},
                               "max_abs": c.max_abs, "max_rel": c.max_rel, "passed": c.passed} for c in checks]},
        "engine": engine_meta,
        "engine_skipped": skipped,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    write_bytes_atomic(bdir / artifacts.RECORD, (json.dumps(record, indent=2) + "\n").encode())
    log(f"{prefix}: done in {record['seconds']:.1f} s")
    return _result_from(record, "built" if engine_meta else "prepared")


def _check_io(file: str, at: str, m: ModelSpec, model: onnx.ModelProto) -> None:
    """The spec's tensors against the prepared graph (the original may have had a fixed batch)."""
    def tensor(vi):
        tt = vi.type.tensor_type
        return GraphTensor(vi.name, ONNX_TO_TRITON.get(tt.elem_type),
                           tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1
                                 for d in tt.shape.dim))

    init = {i.name for i in model.graph.initializer}
    io = GraphIO(tuple(tensor(v) for v in model.graph.input if v.name not in init),
                 tuple(tensor(v) for v in model.graph.output))
    problems = check_against_graph(file, at, m, io)
    if problems:
        raise InputError(problems)


def _verify(file: str, at: str, m: ModelSpec, original, prepared, plan: Plan):
    try:
        checks = verify_prepared(original, prepared.model, plan, prepared.static_batch, m.build.atol, m.build.rtol,
                                 rules=rules_of(m))
    except VerifyError as e:
        if prepared.static_batch:
            inside = (f" (it has subgraphs, {', '.join(prepared.subgraphs)}: shapes pinned to batch 1 inside "
                      "them are not patched)" if prepared.subgraphs else "")
            raise InputError([Problem(file, f"{at}.max_batch_size",
                                      f"cannot make the batch axis dynamic safely{inside}: {e}", REFUSE_FIX)]) from None
        raise InputError([Problem(file, f"{at}.inputs", f"the model does not run over the planned shapes: {e}",
                                  "give min/opt/max the model accepts (for dims that must be multiples of "
                                  "a stride, set stride: on the input)")]) from None
    bad = [c for c in checks if not c.passed]
    if bad:
        c = bad[0]
        why = ("the batch-dynamic graph" if prepared.static_batch else "the prepared graph") + \
              f" differs from the original at {c.label} (output {c.worst_output!r}: max abs {c.max_abs:.2e}, " \
              f"max rel {c.max_rel:.2e})"
        raise InputError([Problem(file, f"{at}.build.atol", f"{why}, outside atol {m.build.atol:g} / "
                                  f"rtol {m.build.rtol:g}",
                                  "re-export with a dynamic batch axis" if prepared.static_batch
                                  else "raise build.atol/rtol if the difference is acceptable")])
    return checks


def _engine(spec: Spec, m: ModelSpec, prepared, prepared_bytes: bytes, plan: Plan, here: Target, cache_dir: Path,
            log, prefix: str):
    """Build, fit to the memory budget by TensorRT's own figure, verify. GPU machines only."""
    cache = cache_dir / f"timing-{here.gpu.compute_capability}-trt{here.trt_version}.cache"
    budget = plan.memory.budget_bytes
    for _attempt in range(3):
        log(f"{prefix}: building TensorRT {here.trt_version} engine on {here.gpu.name} "
            f"({len(plan.profiles)} profile(s), max batch {plan.max_batch}) ...")
        engine = build_engine(prepared_bytes, plan, m.build, cache)
        log(f"{prefix}: engine built in {engine.build_seconds:.1f} s, {len(engine.data) / MIB:.1f} MiB, "
            f"{engine.device_memory_bytes / MIB:.1f} MiB device memory")
        if budget is None or not plan.batched:
            break
        act = m.build.safety_factor * engine.device_memory_bytes
        need = m.instances.count * (len(engine.data) + act)
        if need <= budget:
            break
        room = budget / m.instances.count - len(engine.data)
        cap = int(plan.max_batch * room / act) if act else plan.max_batch
        if cap < 1:
            raise InputError([Problem(spec.shown, f"{model_at(spec, m)}.memory_budget_mb",
                                      f"TensorRT's engine needs {need / MIB:.0f} MiB even at the smallest profile",
                                      f"raise memory_budget_mb to at least {need / MIB:.0f}")])
        if cap >= plan.max_batch:
            cap = plan.max_batch - 1
        plan = make_plan(spec, m, prepared.model, cap=cap)
    checks = verify_engine(engine.data, prepared.model, plan, m.build.atol, m.build.rtol, rules=rules_of(m))
    bad = [c for c in checks if not c.passed]
    if bad:
        c = bad[0]
        raise EngineBuildError(f"{m.name}: the engine differs from ONNX Runtime at {c.label} (output "
                               f"{c.worst_output!r}: max abs {c.max_abs:.2e}, max rel {c.max_rel:.2e}), outside "
                               f"build.atol {m.build.atol:g} / rtol {m.build.rtol:g}; nothing was written")
    log(f"{prefix}: engine verified against ONNX Runtime (Polygraphy): {summary(checks)}")
    meta = {
        "file": f"{artifacts.VERSION}/{artifacts.ENGINE}",
        "sha256": _sha_bytes(engine.data),
        "trt_version": engine.trt_version,
        "gpu_name": here.gpu.name,
        "compute_capability": here.gpu.compute_capability,
        "hardware_compat": m.build.hardware_compat,
        "precision": engine.precision,
        "build_seconds": round(engine.build_seconds, 2),
        "device_memory_bytes": engine.device_memory_bytes,
        "profiles": len(plan.profiles),
        "max_abs": max(c.max_abs for c in checks),
        "max_rel": max(c.max_rel for c in checks),
    }
    return plan, engine.data, meta


def _sha_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _plan_line(plan: Plan) -> str:
    if not plan.batched:
        batch = "no batch axis"
    else:
        batch = f"batch 1/{plan.opt_batch}/{plan.max_batch} (max bounded by {plan.bounded_by})"
    mem = plan.memory
    est = f"{mem.total_bytes / MIB:.1f} MiB est." + (f" of {mem.budget_bytes / MIB:g} MiB" if mem.budget_bytes else "")
    return f"{batch}, {len(plan.profiles)} profile(s), {est}"


def _result_from(record: dict, status: str) -> ModelResult:
    checks = record["verify"]["checks"]
    verify = f"abs {max(c['max_abs'] for c in checks):.1e} / rel {max(c['max_rel'] for c in checks):.1e}"
    engine, skipped = record.get("engine"), record.get("engine_skipped") or ""
    if engine:
        shown = f"{engine['file']} ({engine['build_seconds']:.1f} s)"
    else:
        shown = "not needed" if skipped.startswith("runtime:") else "skipped"
    return ModelResult(record["model"], status, record["plan"]["max_batch"], record["plan"]["bounded_by"],
                       len(record["plan"]["profiles"]), verify, shown)


def table(results: list[ModelResult]) -> str:
    """One row per model; a failed model's row says why in a last column."""
    head = ("model", "status", "max batch", "bound by", "profiles", "verify (max err)", "engine", "runtime")
    any_failed = any(r.failed for r in results)
    rows = [(*head, "problem") if any_failed else head]
    for r in results:
        if r.failed:
            why = r.reason if len(r.reason) <= 100 else r.reason[:99] + "…"  # the whole of it is in the error
            rows.append((r.name, r.status, "-", "-", "-", "-", "-", "-", why))
            continue
        row = (r.name, r.status, str(r.max_batch), r.bounded_by, str(r.profiles), r.verify, r.engine, r.runtime)
        rows.append((*row, "") if any_failed else row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
