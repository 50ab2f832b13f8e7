"""Init container: build each model's TensorRT engine on the node, with the TensorRT that serves it.

The plan (`$BUILD_PLAN`, JSON written by `tritonkit deploy`) is computed where the kit runs: per
model, the ONNX file's SHA-256 and the trtexec flags (min/opt/max profiles, the memory bound, the
precision). Only the build runs here. Standard library only: it runs in NGC's images as they are.

Engines are cached in `$BUILD_CACHE/<model>/<key>/model.plan`, the key being the ONNX digest, the
GPU's name, the TensorRT version and the flags: any change rebuilds, nothing else does. Each
served engine is copied to `$BUILD_OUT/<model>/1/model.plan`, the folder Triton mounts.

Any problem exits 1 with one line naming the model and the fix, before anything is written for
that model; a failed build leaves no engine behind (it is written beside and renamed on success).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TRTEXEC = ("trtexec", "/usr/src/tensorrt/bin/trtexec", "/opt/tensorrt/bin/trtexec")


def fail(msg: str) -> None:
    print(f"build-engines: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def gpu_name() -> str | None:
    """The GPU this container sees: nvidia-smi on a dGPU, the device tree's model on Jetson."""
    smi = shutil.which("nvidia-smi")
    if smi:
        done = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
        names = [n.strip() for n in done.stdout.splitlines() if n.strip()]
        if done.returncode == 0 and names:
            return names[0]
    tegra = Path("/proc/device-tree/model")
    if Path("/dev/nvhost-ctrl-gpu").exists() and tegra.is_file():
        return tegra.read_text(errors="replace").strip("\x00 \n")
    return None


def trtexec() -> str | None:
    for name in TRTEXEC:
        found = shutil.which(name) or (name if os.access(name, os.X_OK) else None)
        if found:
            return found
    return None


def trt_version(binary: str) -> str:
    """trtexec names its TensorRT on its first line: [TensorRT v100500] is 10.5.0."""
    done = subprocess.run([binary, "--help"], capture_output=True, text=True)
    m = re.search(r"TensorRT v(\d+)", done.stdout + done.stderr)
    if not m:
        fail(f"{binary} did not report its TensorRT version; fix: use the build image the support matrix names")
    v = m.group(1)  # MMmmpp: 100500 -> 10.5.0, 8601 -> 8.6.1
    major, rest = (v[:-4], v[-4:]) if len(v) > 4 else (v[:-3], v[-3:].rjust(4, "0"))
    return f"{int(major)}.{int(rest[:2])}.{int(rest[2:])}"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def main() -> None:
    plan_path, src = Path(os.environ["BUILD_PLAN"]), Path(os.environ["BUILD_SOURCE"])
    cache, out = Path(os.environ["BUILD_CACHE"]), Path(os.environ["BUILD_OUT"])
    plan = json.loads(plan_path.read_text())
    gpu = gpu_name()
    names = ", ".join(m["name"] for m in plan["models"])
    if gpu is None:
        fail(f"{names}: no GPU visible in this container (nvidia-smi found none, and this is no Jetson), so no "
             "engine was built; fix: give the pod "
             "the GPU (gpu.count, runtimeClassName nvidia on k3s, the NVIDIA device plugin) or deploy the "
             "models with runtime: onnxruntime")
    binary = trtexec()
    if binary is None:
        fail(f"no trtexec in this image (looked for {', '.join(TRTEXEC)}); fix: set engines.build.image to the "
             "NGC TensorRT image of the serving release")
    version = trt_version(binary)
    if plan.get("tensorrt") and not version.startswith(plan["tensorrt"]):
        fail(f"this image has TensorRT {version}, the serving release has {plan['tensorrt']}; fix: set "
             "engines.build.image to the release the support matrix names")
    for m in plan["models"]:
        onnx = src / m["name"] / "1" / "model.onnx"
        if not onnx.is_file():
            fail(f"{m['name']}: {onnx} is missing; fix: the engine source must hold <model>/1/model.onnx")
        if sha256(onnx) != m["sha256"]:
            fail(f"{m['name']}: {onnx} is not the ONNX the plan was made from; fix: run tritonkit deploy again")
        key = hashlib.sha256(json.dumps([m["sha256"], gpu, version, m["args"]]).encode()).hexdigest()[:16]
        engine = cache / m["name"] / key / "model.plan"
        if engine.is_file():
            print(f"build-engines: {m['name']}: cached ({key}, {gpu}, TensorRT {version})", flush=True)
        else:
            engine.parent.mkdir(parents=True, exist_ok=True)
            partial = engine.with_suffix(".partial")
            done = subprocess.run([binary, f"--onnx={onnx}", f"--saveEngine={partial}",
                                   f"--timingCacheFile={cache / 'timing.cache'}", "--skipInference", *m["args"]],
                                  capture_output=True, text=True)
            if done.returncode != 0 or not partial.is_file():
                partial.unlink(missing_ok=True)
                lines = [x for x in (done.stdout + done.stderr).splitlines() if "Error" in x or "error" in x]
                why = (lines[-1] if lines else f"trtexec exited {done.returncode}").strip()[:300]
                hint = ("lower build.workspace_mb or the max batch" if "memory" in why.lower()
                        else "check the op against TensorRT's ONNX support, or set runtime: onnxruntime")
                fail(f"{m['name']}: TensorRT {version} could not build the engine ({why}); fix: {hint}")
            partial.replace(engine)
            print(f"build-engines: {m['name']}: built ({key}, {gpu}, TensorRT {version})", flush=True)
        served = out / m["name"] / "1" / "model.plan"
        served.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(engine, served.with_suffix(".partial"))
        served.with_suffix(".partial").replace(served)


if __name__ == "__main__":
    main()
