"""The kit as a user installs it: a wheel built from this checkout, installed into a fresh virtual
environment outside the repository, run from a folder that is not the checkout.

The fresh environment takes the kit's dependencies from the test's own environment (a `.pth`
line), so nothing is downloaded but the build backend: what is under test is the wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent

# Modules that only run inside another program: the Triton python-backend stub imports the
# runner (it needs triton_python_backend_utils), Locust imports the locustfile (it patches with
# gevent on import). Both must still be in the wheel.
HOSTED = {"tritonkit.configs.runner_model", "tritonkit.loadtests.locustfile"}

IMPORT_ALL = """
import importlib, json, pkgutil, sys
import tritonkit
hosted = set(json.loads(sys.argv[1]))
names = sorted(m.name for m in pkgutil.walk_packages(tritonkit.__path__, "tritonkit."))
for name in names:
    if name not in hosted:
        importlib.import_module(name)
print(json.dumps({"file": tritonkit.__file__, "modules": names}))
"""


def _shipped_sources() -> set[str]:
    """Where every tracked Python file outside tests/ lands in the wheel: a stage folder `X/` at the
    top of the repository installs as `tritonkit/X/`."""
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO_ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    shipped = set()
    for f in files:
        top = f.split("/")[0]
        if "/" not in f or top == "tests":
            continue  # setup.py and the tests are not part of the kit
        shipped.add(f if top == "tritonkit" else f"tritonkit/{f}")
    return shipped


def _checkout_copy(dest: Path) -> Path:
    """The files git would hand a fresh clone (tracked, and new ones it does not ignore), so that
    a stale build/ folder or egg-info in this checkout cannot fill gaps in the wheel."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO_ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for f in filter(None, files):
        src = REPO_ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    source = _checkout_copy(tmp_path_factory.mktemp("source"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dist),
                           str(source)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (path,) = dist.glob("triton_edge_kit-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    env = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    site = next((env / "lib").glob("python3*/site-packages"))
    (site / "kit-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin/python"), "install",
                           "--no-deps", "--quiet", str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return env


def test_the_wheel_carries_every_module_the_runner_and_the_chart(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_shipped_sources() - names)
    assert not missing, f"source files missing from {wheel.name}: {missing}"
    assert any(n.startswith("tritonkit/tuner/") and n.endswith(".py") for n in names)
    assert "tritonkit/configs/runner_model.py" in names
    chart = {n for n in names if n.startswith("tritonkit/helm/triton-edge/")}
    for f in ("Chart.yaml", "values.yaml", "values.schema.json", ".helmignore", "templates/deployment.yaml",
              "templates/_helpers.tpl", "templates/locust/deployment.yaml", "files/fetch_engines.py"):
        assert f"tritonkit/helm/triton-edge/{f}" in chart, f
    assert not [n for n in names if n.startswith("tests/")]


def test_the_installed_kit_runs_outside_the_checkout(venv, tmp_path):
    """--help, sample-model, validate, configs, deploy --dry-run, and every module imports, from a
    folder with no checkout in sight."""
    work = tmp_path / "elsewhere"
    work.mkdir()
    kit = str(venv / "bin" / "tritonkit")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"

    def run(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{args}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
        return done

    assert "tune" in run(kit, "--help").stdout
    run(kit, "sample-model", "--out", "models/edge_mlp.onnx", "--width", "64", "--layers", "2")
    spec = yaml.safe_load((REPO_ROOT / "deploy.yaml").read_text())
    (work / "deploy.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert "ok" in run(kit, "validate").stdout
    run(kit, "configs", "--out", "model_repository")
    assert (work / "model_repository/edge_mlp/config.pbtxt").is_file()
    assert (work / "model_repository/edge_mlp/1/model.py").is_file()  # the runner, from the wheel
    run(kit, "deploy", "--dry-run", "--out", "manifests")
    rendered = list((work / "manifests").rglob("*.yaml"))
    assert any("Deployment" in p.read_text() for p in rendered), rendered

    out = json.loads(run(str(venv / "bin/python"), "-c", IMPORT_ALL, json.dumps(sorted(HOSTED))).stdout)
    assert out["file"].startswith(str(venv)), out["file"]  # the wheel's copy, not the checkout's
    assert set(out["modules"]) >= HOSTED
    assert {"tritonkit.tuner.offline", "tritonkit.helm"} <= set(out["modules"])
