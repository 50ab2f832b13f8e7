"""`runtime: auto` on the local server follows what its install offers: a full Triton build (named by
$TRITONSERVER or found on PATH, as `find_install` looks them up) whose backend folder has the native
onnxruntime backend serves ONNX with it; the bundled server, python backend only, with ONNX Runtime
in the python backend. No full build exists here, so these tests lay out its folders and check the
detection only: the stand-in binary is never started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import tritonkit, write_spec
from tritonkit.configs.generate import gpu_present, resolve_runtime
from tritonkit.loadtests.server_probe import local_install_line
from tritonkit.server import LocalTriton, find_install
from tritonkit.spec import ModelSpec, ServerSpec
from tritonkit.support import BY_RELEASE, Target

pytestmark = pytest.mark.skipif(gpu_present(), reason="with a GPU and TensorRT, auto picks tensorrt")

AUTO = ModelSpec.model_validate({"name": "m", "onnx": "m.onnx"})


def _full_build(root: Path, backends: tuple[str, ...] = ("onnxruntime", "python")) -> Path:
    """A release's layout: bin/tritonserver and backends/<name>/libtriton_<name>.so."""
    binary = root / "bin" / "tritonserver"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\nexit 1\n")  # detection only: never served
    binary.chmod(0o755)
    for name in backends:
        (root / "backends" / name).mkdir(parents=True)
        (root / "backends" / name / f"libtriton_{name}.so").write_bytes(b"")
    if "python" in backends:
        (root / "backends" / "python" / "triton_python_backend_utils.py").write_text("")
    (root / "backends" / "notes").mkdir()  # a folder without its library is no backend
    return binary


def _no_tritonserver_on_path(monkeypatch) -> None:
    monkeypatch.delenv("TRITONSERVER", raising=False)
    monkeypatch.setenv("PATH", os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                                               if d and not (Path(d) / "tritonserver").exists()))


def test_a_full_build_named_by_the_env_var_serves_onnx_with_its_onnxruntime_backend(tmp_path, monkeypatch):
    binary = _full_build(tmp_path / "tritonserver")
    monkeypatch.setenv("TRITONSERVER", str(binary))
    install = find_install()
    assert not install.bundled
    assert install.backend_dir == (tmp_path / "tritonserver" / "backends").resolve()
    assert install.backends == ("onnxruntime", "python") and install.has_backend("onnxruntime")
    assert resolve_runtime(AUTO, "local") == "onnxruntime"
    for explicit in ("python-onnxruntime", "onnxruntime"):  # a runtime the spec names stays
        assert resolve_runtime(AUTO.model_copy(update={"runtime": explicit}), "local") == explicit
    # the server it would start looks for its backends where they were found (never started here)
    cmd = LocalTriton(tmp_path / "repo", ServerSpec(), tmp_path / "state").command(
        install, {"http_port": 1, "grpc_port": 2, "metrics_port": 3}, ("h", "v"))
    assert f"--backend-directory={install.backend_dir}" in cmd
    line = local_install_line()
    assert str(binary) in line and "onnxruntime, python" in line and "serves ONNX with onnxruntime" in line, line


def test_a_full_build_on_path_is_found_the_same_way(tmp_path, monkeypatch):
    binary = _full_build(tmp_path / "opt")
    _no_tritonserver_on_path(monkeypatch)
    monkeypatch.setenv("PATH", f"{binary.parent}{os.pathsep}{os.environ['PATH']}")
    assert find_install().binary == binary
    assert resolve_runtime(AUTO, "local") == "onnxruntime"


def test_a_full_build_without_the_onnxruntime_backend_uses_the_python_backend(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONSERVER", str(_full_build(tmp_path / "tritonserver", ("python",))))
    assert find_install().backends == ("python",)
    assert resolve_runtime(AUTO, "local") == "python-onnxruntime"


def test_the_bundled_server_uses_the_python_backend(monkeypatch):
    _no_tritonserver_on_path(monkeypatch)
    install = find_install()
    assert install.bundled and install.backends == ("python",)
    assert resolve_runtime(AUTO, "local") == "python-onnxruntime"
    cpu_node = Target(BY_RELEASE["24.10"], "x86", gpu=False)
    assert resolve_runtime(AUTO, cpu_node) == "onnxruntime"  # NGC images have it, whatever runs locally
    line = local_install_line()
    assert "bundled with nvidia-pytriton" in line and "python-onnxruntime" in line, line


def test_configs_says_which_backend_the_local_server_gets(tmp_path, workdir):
    """`tritonkit configs` as a user runs it, with $TRITONSERVER naming a full build: the config is
    written for the native backend and the command says so."""
    binary = _full_build(tmp_path / "full")
    write_spec(workdir, {"models": [{"name": "m", "onnx": "onnx/mlp.onnx", "max_batch_size": 4}]})
    native = tritonkit("configs", "--spec", "deploy.yaml", "--out", "native", cwd=workdir,
                       env={"TRITONSERVER": str(binary)})
    assert native.returncode == 0, native.stderr
    assert "(runtime onnxruntime)" in native.stdout, native.stdout
    config = (workdir / "native" / "m" / "config.pbtxt").read_text()
    assert 'platform: "onnxruntime_onnx"' in config and not (workdir / "native" / "m" / "1" / "model.py").exists()
    env = {k: v for k, v in os.environ.items() if k != "TRITONSERVER"}
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                  if d and not (Path(d) / "tritonserver").exists())
    bundled = tritonkit("configs", "--spec", "deploy.yaml", "--out", "bundled", cwd=workdir, env=env)
    assert bundled.returncode == 0, bundled.stderr
    assert "(runtime python-onnxruntime)" in bundled.stdout, bundled.stdout
