"""Installing by role: the base install an edge box gets carries no Helm, `tritonkit deploy` without
the `deploy` extra says which extra to add, and the kit image's Containerfile refers only to things
that exist (no container engine here to build it)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO_ROOT, write_spec

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
DEPLOY_PACKAGES = {"helm-python-sdk", "kubernetes-validate"}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_base_install_leaves_helm_to_the_deploy_extra_and_dev_brings_it():
    assert not _names(PROJECT["dependencies"]) & DEPLOY_PACKAGES
    extras = PROJECT["optional-dependencies"]
    assert _names(extras["deploy"]) >= DEPLOY_PACKAGES
    # make test / make demo install .[dev]: the chart tests need deploy's packages
    assert any(r.replace(" ", "").startswith(f"{PROJECT['name']}[deploy") for r in extras["dev"])


# Hide the deploy extra's modules from this interpreter, then run the CLI as a user would.
WITHOUT_DEPLOY = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("helm_python", "kubernetes_validate"):
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, Hide())
import importlib.util
real = importlib.util.find_spec
importlib.util.find_spec = lambda n, p=None: None if n in ("helm_python", "kubernetes_validate") else real(n, p)
from tritonkit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_bench_peer_without_the_peer_extra_names_the_extra(tmp_path):
    hide_ma = WITHOUT_DEPLOY.replace('("helm_python", "kubernetes_validate")', '("model_analyzer",)')
    (tmp_path / "m.onnx").write_bytes(b"")
    spec = write_spec(tmp_path, {"models": [{"name": "m", "onnx": "m.onnx"}]})
    done = subprocess.run([sys.executable, "-c", hide_ma, "bench", "peer", "--spec", str(spec),
                           "--out", str(tmp_path / "out")], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "[peer]" in done.stderr and "pip install" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_deploy_without_the_deploy_extra_names_the_extra(tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"")  # never read: the extra is checked first
    spec = write_spec(tmp_path, {"models": [{"name": "m", "onnx": "m.onnx"}]})
    done = subprocess.run([sys.executable, "-c", WITHOUT_DEPLOY, "deploy", "--spec", str(spec), "--dry-run",
                           "--out", str(tmp_path / "out")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert "[deploy]" in done.stderr and "pip install" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def _containerfile() -> str:
    return (REPO_ROOT / "Containerfile").read_text()


def test_the_kit_image_installs_from_the_wheelhouse_make_fills():
    text = _containerfile()
    makefile = (REPO_ROOT / "Makefile").read_text()
    default = re.search(r"^WHEELHOUSE \?= (\S+)$", makefile, re.M).group(1)
    assert re.search(r"^wheelhouse:.*\n\t\$\(BIN\)/pip wheel .*--wheel-dir \$\(WHEELHOUSE\) \.$", makefile, re.M)
    copies = re.findall(r"^COPY (\S+) (\S+)$", text, re.M)
    assert [src.rstrip("/") for src, _ in copies] == [default]  # nothing else from the build context
    dest = copies[0][1].rstrip("/")
    install = re.search(r"pip install (.*?)(?:\\\n|&&|$)", text).group(1)
    assert "--no-index" in install and f"--find-links {dest}" in install and PROJECT["name"] in install.split()
    assert f"/{default}/" in (REPO_ROOT / ".gitignore").read_text()


def test_the_kit_image_has_what_the_chart_runs_in_it():
    """The chart runs `tritonkit`, `locust` and `python3` in the kit image, as uid 1000, with the
    locustfile at locust.locustfilePath."""
    text = _containerfile()
    values = yaml.safe_load((REPO_ROOT / "helm/triton-edge/values.yaml").read_text())
    assert PROJECT["scripts"]["tritonkit"] == "tritonkit.cli:main"
    assert "locust" in _names(PROJECT["dependencies"])  # its console script comes with the base install
    link = re.search(r'find_spec\("([\w.]+)"\).*?\)\'\)"\s*\\\n\s*(\S+)', text, re.S)
    module, path = link.groups()
    assert module == "tritonkit.loadtests.locustfile" and (REPO_ROOT / "loadtests/locustfile.py").is_file()
    assert path == values["locust"]["locustfilePath"]
    uid = values["podSecurityContext"]["runAsUser"]
    assert f"--uid {uid} " in text and re.search(rf"^USER {uid}$", text, re.M)
    image = values["kit"]["image"]
    assert f"-t {image['repository']}:{image['tag']} " in text and image["tag"] == PROJECT["version"]
    assert "Containerfile" in (REPO_ROOT / "helm/triton-edge/README.md").read_text()
