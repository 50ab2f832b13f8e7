"""What this machine can build engines with: the NVIDIA GPU (through the driver's libcuda, present
on desktop GPUs and Jetson alike) and the TensorRT Python package. Nothing here needs CUDA Python."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: str  # "8.7"


@dataclass(frozen=True)
class Target:
    """Where an engine would run: this machine's GPU and TensorRT (None when absent)."""

    gpu: Gpu | None
    trt_version: str | None
    reason: str | None  # why engines cannot be built here; None when they can


def detect_gpu() -> tuple[Gpu | None, str | None]:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None, "no NVIDIA driver (libcuda.so.1 not found)"
    if cuda.cuInit(0) != 0:
        return None, "the NVIDIA driver found no usable GPU (cuInit failed)"
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return None, "no NVIDIA GPU visible (cuDeviceGetCount is 0)"
    dev = ctypes.c_int(0)
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    name = ctypes.create_string_buffer(256)
    cuda.cuDeviceGetName(name, 256, dev)
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    cuda.cuDeviceGetAttribute(ctypes.byref(major), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    return Gpu(name.value.decode(errors="replace"), f"{major.value}.{minor.value}"), None


def trt_version() -> tuple[str | None, str | None]:
    try:
        import tensorrt as trt
    except ImportError:
        return None, "TensorRT is not installed (pip install 'triton-edge-kit[gpu]')"
    return trt.__version__, None


def target() -> Target:
    """TensorRT is checked first: importing it is cheap and its absence is the common reason."""
    version, why_trt = trt_version()
    gpu, why_gpu = detect_gpu()
    reason = why_gpu or why_trt
    if reason is None and int(version.split(".")[0]) < 10:
        reason = f"TensorRT {version} is too old (10 or newer is needed)"
    return Target(gpu, version, reason)
