"""TensorRT engine build (TensorRT 10 and 11) and engine-vs-ONNX-Runtime verification.

TensorRT is imported inside the functions: the rest of the kit runs where it is not installed.
Version differences are found with hasattr rather than version numbers:
- TRT 11 networks are always strongly typed: no FP16/TF32 builder flags; lower precision must be
  in the ONNX graph itself. TRT 10 still has the flags.
- The explicit-batch creation flag is gone (TRT 10 ignores it, 11 removed it): networks are
  created with no flags in both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from tritonkit.errors import KitError
from tritonkit.files import write_bytes_atomic
from tritonkit.spec import BuildSpec

from .plan import Plan
from .verify import Check, compare, random_feed, session


class EngineBuildError(KitError):
    """TensorRT could not parse or build the model (a runtime failure: exit code 1)."""


@dataclass(frozen=True)
class Engine:
    data: bytes
    build_seconds: float
    device_memory_bytes: int  # TensorRT's activation memory for the largest profile
    trt_version: str
    precision: str


def _flag(trt, name: str):
    return getattr(trt.BuilderFlag, name, None)


def build_engine(onnx_bytes: bytes, plan: Plan, settings: BuildSpec, cache_path: Path) -> Engine:
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes):
        errors = "; ".join(str(parser.get_error(i).desc()) for i in range(parser.num_errors))
        raise EngineBuildError(f"TensorRT could not parse the prepared ONNX: {errors}")

    config = builder.create_builder_config()
    if settings.workspace_mb:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_mb << 20)
    config.builder_optimization_level = settings.optimization_level
    _set_precision(trt, config, settings.precision)
    if settings.hardware_compat != "none":
        level = getattr(trt.HardwareCompatibilityLevel, settings.hardware_compat.upper(), None)
        if level is None:
            raise EngineBuildError(f"TensorRT {trt.__version__} has no hardware compatibility level "
                                   f"{settings.hardware_compat!r}; set build.hardware_compat: none")
        config.hardware_compatibility_level = level

    # The timing cache makes rebuilds (new shapes, new settings) take seconds instead of minutes.
    cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.is_file() else b"")
    config.set_timing_cache(cache, ignore_mismatch=True)  # a cache from another device is skipped, not fatal

    for ranges in plan.profiles:
        profile = builder.create_optimization_profile()
        for r in ranges:
            profile.set_shape(r.name, r.min, r.opt, r.max)
        config.add_optimization_profile(profile)

    t0 = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    seconds = time.perf_counter() - t0
    if serialized is None:
        raise EngineBuildError("TensorRT could not build the engine (its messages are above)")
    write_bytes_atomic(cache_path, bytes(memoryview(config.get_timing_cache().serialize())))
    data = bytes(memoryview(serialized))
    return Engine(data, seconds, device_memory(data, len(plan.profiles)), trt.__version__, settings.precision)


def _set_precision(trt, config, precision: str) -> None:
    fp16, tf32 = _flag(trt, "FP16"), _flag(trt, "TF32")
    if precision == "fp16":
        if fp16 is None:
            raise EngineBuildError(f"TensorRT {trt.__version__} builds strongly typed networks, so FP16 must come "
                                   "from the ONNX graph: convert the model to FP16 and set build.precision: fp32")
        config.set_flag(fp16)
    elif precision == "fp32" and tf32 is not None:
        config.clear_flag(tf32)  # TRT 10 enables TF32 by default; fp32 means full FP32 matmuls
    elif precision == "tf32" and tf32 is not None:
        config.set_flag(tf32)


def device_memory(data: bytes, n_profiles: int) -> int:
    import tensorrt as trt

    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(data)
    if hasattr(engine, "get_device_memory_size_for_profile_v2"):
        return max(int(engine.get_device_memory_size_for_profile_v2(i)) for i in range(n_profiles))
    return int(getattr(engine, "device_memory_size_v2", getattr(engine, "device_memory_size", 0)))


def verify_engine(data: bytes, onnx_model, plan: Plan, atol: float, rtol: float, seed: int = 0,
                  rules: dict | None = None):
    """The engine against ONNX Runtime on the prepared ONNX, through Polygraphy's runners, at every
    profile's min/opt/max shapes (each run on its own profile)."""
    from polygraphy.backend.onnxrt import OnnxrtRunner
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    checks = []
    ort_runner = OnnxrtRunner(lambda: session(onnx_model))
    engine = EngineFromBytes(data)()  # deserialized once, one runner (context) per profile
    with ort_runner:
        for i, label, shapes in plan.shape_points():
            profile = int(label.split()[1]) if label.startswith("profile") else 0
            feed = random_feed(shapes, plan.dtypes, seed + i, rules)
            with TrtRunner(engine, optimization_profile=profile) as trt_runner:
                got = {k: v.copy() for k, v in trt_runner.infer(feed).items()}
            want = ort_runner.infer(feed)
            checks.append(Check(label, shapes, *compare(got, dict(want), atol, rtol)))
    return checks
