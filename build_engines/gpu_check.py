"""`make gpu-check`: on an NVIDIA machine, build the sample model's engine with a dynamic batch
profile, verify it against ONNX Runtime through Polygraphy at the profile's min, opt and max
shapes, and time both at batch 1, at the opt batch (the spec's preferred size: what a tuned config
dispatches) and at the max. Prints two tables and the whole run's time (a few minutes on a T4).
Elsewhere it prints one line saying why it did not run.

Run as a module (python -m tritonkit.build_engines.gpu_check) so the package imports resolve.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from tritonkit import sample_model
from tritonkit.spec import Batching, DeploySpec, ModelSpec, Spec

from .gpu import target
from .plan import make_plan
from .trt_build import build_engine, verify_engine
from .verify import random_feed

OPT_BATCH = 8
MAX_BATCH = 32
RUNS = 50


def _median_ms(fn, feed, runs: int = RUNS) -> float:
    for _ in range(5):
        fn(feed)  # warm-up: first runs pay allocations and lazy initialisation
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn(feed)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> int:
    t_start = time.perf_counter()
    here = target()
    if here.reason:
        print(f"gpu-check skipped: {here.reason}")
        return 0

    import onnxruntime as ort
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    with tempfile.TemporaryDirectory() as tmp:
        path = sample_model.write(Path(tmp) / "edge_mlp.onnx")
        m = ModelSpec(name="edge_mlp", onnx=path, max_batch_size=MAX_BATCH,
                      batching=Batching(preferred_batch_sizes=[OPT_BATCH]))
        spec = Spec(DeploySpec(models=[m]), Path(tmp) / "deploy.yaml")
        model = sample_model.build()
        plan = make_plan(spec, m, model)
        data = model.SerializeToString()
        engine = build_engine(data, plan, m.build, Path(tmp) / "timing.cache")
        checks = verify_engine(engine.data, model, plan, m.build.atol, m.build.rtol)

        sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        rows = []
        with TrtRunner(EngineFromBytes(engine.data)) as trt_runner:
            for batch in (1, plan.opt_batch, plan.max_batch):
                feed = random_feed({sample_model.INPUT_NAME: (batch, 2048)}, plan.dtypes, batch)
                ort_ms = _median_ms(lambda f: sess.run(None, f), feed)
                trt_ms = _median_ms(trt_runner.infer, feed)
                rows.append((batch, ort_ms, trt_ms))

    ok = all(c.passed for c in checks)
    print(f"TensorRT {engine.trt_version} on {here.gpu.name} (sm {here.gpu.compute_capability}); "
          f"profile batch 1/{plan.opt_batch}/{plan.max_batch}; build {engine.build_seconds:.1f} s; "
          f"{engine.device_memory_bytes / 2**20:.1f} MiB device memory")
    print(f"{'shape':<24}  {'max abs err':>11}  {'max rel err':>11}  verified (atol {m.build.atol:g}, "
          f"rtol {m.build.rtol:g})")
    for c in checks:
        print(f"{c.label:<24}  {c.max_abs:>11.2e}  {c.max_rel:>11.2e}  {'yes' if c.passed else 'NO'}")
    print(f"{'batch':>5}  {'ORT CPU ms':>10}  {'TRT ms':>8}  {'speed-up':>8}")
    for batch, ort_ms, trt_ms in rows:
        print(f"{batch:>5}  {ort_ms:>10.3f}  {trt_ms:>8.3f}  {ort_ms / trt_ms:>7.1f}x")
    print(f"gpu-check {'passed' if ok else 'FAILED'} in {time.perf_counter() - t_start:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
