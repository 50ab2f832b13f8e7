"""`tritonkit deploy` for a node it does not run on: the target decides the runtime, the engines
are built on the node (its script run here for real, on a CPU), the models travel as one archive,
and preflight reads the cluster through kubectl. No cluster exists here: kubectl is a stand-in
script that prints the JSON a real API server returns; Helm, the chart and the node script are real.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import stat
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT, tritonkit, write_spec
from tritonkit.configs.generate import resolve_runtime
from tritonkit.helm import bundle
from tritonkit.spec import ModelSpec
from tritonkit.support import BY_RELEASE, RELEASES, Target, nearest, target_problems

CHART = REPO_ROOT / "helm" / "triton-edge"
NODE_SCRIPT = CHART / "files" / "build_engines.py"

MODELS = [
    {"name": "mlp", "onnx": "onnx/mlp.onnx", "max_batch_size": 8, "slo": {"p95_ms": 20}},
    {"name": "seq_mean", "onnx": "onnx/seq_mean.onnx", "max_batch_size": 8, "runtime": "onnxruntime",
     "inputs": [{"name": "x", "dims": [-1], "min": [1], "opt": [4], "max": [16]}]},
]

# The three targets and Jetson on the SBSA image: (deploy block, server image, flavor, arches).
TARGETS = {
    "t4-24.10": ({"triton_version": "24.10", "platform": "x86", "gpus": 1},
                 "nvcr.io/nvidia/tritonserver:24.10-py3", "nvcr.io/nvidia/tensorrt:24.10-py3", ["amd64", "arm64"]),
    "newest": ({"triton_version": RELEASES[-1].release, "platform": "x86", "gpus": 1},
               f"nvcr.io/nvidia/tritonserver:{RELEASES[-1].release}-py3",
               f"nvcr.io/nvidia/tensorrt:{RELEASES[-1].release}-py3", ["amd64", "arm64"]),
    "orin-igpu": ({"triton_version": "24.10", "platform": "jetson", "gpus": 1},
                  "nvcr.io/nvidia/tritonserver:24.10-py3-igpu", "nvcr.io/nvidia/tritonserver:24.10-py3-igpu",
                  ["arm64"]),
    "orin-sbsa": ({"triton_version": "26.03", "platform": "jetson", "gpus": 1},
                  "nvcr.io/nvidia/tritonserver:26.03-py3", "nvcr.io/nvidia/tensorrt:26.03-py3", ["amd64", "arm64"]),
}


def _spec(workdir: Path, deploy: dict) -> Path:
    return write_spec(workdir, {"models": MODELS, "deploy": {"release": "edge", "namespace": "inference",
                                                             **deploy}})


def _docs(out: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all((out / "manifests.yaml").read_text()) if d]


def _pod(docs: list[dict]) -> dict:
    return next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]


@pytest.mark.parametrize("name", list(TARGETS))
def test_dry_run_for_each_target(workdir, name):
    deploy, server_image, build_image, arches = TARGETS[name]
    _spec(workdir, deploy)
    p = tritonkit("deploy", "--dry-run", "--out", "out", cwd=workdir)
    assert p.returncode == 0, p.stderr
    # Rendered, strictly linted and schema-checked for the oldest and newest Kubernetes it knows.
    assert "lint clean (strict)" in p.stdout and "valid for Kubernetes 1.28 and" in p.stdout, p.stdout
    assert f"images for {', '.join(arches)}" in p.stdout
    docs = _docs(workdir / "out")
    pod = _pod(docs)
    triton = next(c for c in pod["containers"] if c["name"] == "triton")
    assert triton["image"] == server_image and triton["resources"]["limits"]["nvidia.com/gpu"] == 1
    configs = next(d for d in docs if d["metadata"]["name"].endswith("model-configs"))["data"]
    # The target decides: TensorRT for `auto` on a GPU node, though this machine has no GPU at all.
    assert 'platform: "tensorrt_plan"' in configs["mlp.config.pbtxt"]
    assert 'platform: "onnxruntime_onnx"' in configs["seq_mean.config.pbtxt"]  # asked for by name
    assert all("KIND_GPU" in c for c in configs.values())
    build = next(c for c in pod["initContainers"] if c["name"] == "build-engines")
    assert build["image"] == build_image and build["command"] == ["python3", "/build/build_engines.py"]
    plan = json.loads(next(d for d in docs if d["metadata"]["name"].endswith("-build"))["data"]["plan.json"])
    assert [m["name"] for m in plan["models"]] == ["mlp"]  # seq_mean serves its ONNX
    assert plan["tensorrt"] == BY_RELEASE[deploy["triton_version"]].tensorrt
    assert plan["models"][0]["args"][:3] == ["--minShapes=input:1x256", "--optShapes=input:8x256",
                                             "--maxShapes=input:8x256"]
    assert "preflight: would check the cluster" in p.stdout and "RuntimeClass" in p.stdout


def test_a_cpu_node_serves_onnx_and_builds_nothing(workdir):
    _spec(workdir, {"gpus": 0})
    p = tritonkit("deploy", "--dry-run", "--out", "out", cwd=workdir)
    assert p.returncode == 0, p.stderr
    docs = _docs(workdir / "out")
    configs = next(d for d in docs if d["metadata"]["name"].endswith("model-configs"))["data"]
    assert all('platform: "onnxruntime_onnx"' in c and "KIND_CPU" in c for c in configs.values())
    assert "initContainers" not in _pod(docs)


@pytest.mark.parametrize("deploy, field, says", [
    ({"triton_version": "23.08"}, "deploy.triton_version", "nearest supported release, 24.05"),
    ({"triton_version": "27.01"}, "deploy.triton_version", f"nearest supported release, {RELEASES[-1].release}"),
    ({"gpus": 0, "runtime": "tensorrt"}, "models[0].runtime", "tensorrt needs a GPU"),
])
def test_targets_outside_the_matrix_are_refused(workdir, deploy, field, says):
    runtime = deploy.pop("runtime", None)
    path = _spec(workdir, deploy)
    if runtime:
        data = yaml.safe_load(path.read_text())
        data["models"][0]["runtime"] = runtime
        path.write_text(yaml.safe_dump(data))
    p = tritonkit("deploy", "--dry-run", "--out", "out", cwd=workdir)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert field in p.stderr and says in p.stderr and "deploy.yaml" in p.stderr
    assert not (workdir / "out").exists() and not (workdir / "model_repository").exists()


def test_support_matrix_rules():
    assert nearest("24.13").release in ("24.12", "25.01") and nearest("20.01").release == RELEASES[0].release
    assert target_problems("d.yaml", "24.10", "x86", {"models[0]": "python-onnxruntime"}, 1)[0].path == \
        "models[0].runtime"
    assert target_problems("d.yaml", "24.10", "riscv", {}, 1)[0].path == "deploy.platform"
    orin = Target(BY_RELEASE["26.02"], "jetson", True)
    assert orin.flavor == "py3-igpu" and orin.image_arches == ("arm64",)
    assert Target(BY_RELEASE["26.03"], "jetson", True).flavor == "py3"
    cpu = Target(BY_RELEASE["24.10"], "x86", False)
    assert cpu.runtime("auto") == "onnxruntime" and cpu.instance_kind("onnxruntime") == "cpu"


def test_auto_on_the_bundled_server_never_picks_a_backend_it_lacks(monkeypatch):
    """A GPU and TensorRT on this machine are not enough: the bundled server has no tensorrt backend."""
    from tritonkit.configs import generate as gen
    from tritonkit.server import find_install

    m = ModelSpec(name="m", onnx="m.onnx")
    monkeypatch.setattr(gen, "gpu_present", lambda: True)
    assert find_install().has_backend("tensorrt") is False
    assert resolve_runtime(m, "local") in ("onnxruntime", "python-onnxruntime")


# -- the node's build script, run here --------------------------------------------------------------

def test_node_build_script_on_a_cpu_says_no_gpu_and_writes_nothing(tmp_path):
    source, cache = tmp_path / "engines", tmp_path / "cache"
    (source / "mlp" / "1").mkdir(parents=True)
    onnx = source / "mlp" / "1" / "model.onnx"
    onnx.write_bytes(b"onnx bytes")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"format": 1, "tensorrt": None, "models": [
        {"name": "mlp", "sha256": hashlib.sha256(b"onnx bytes").hexdigest(), "args": ["--minShapes=input:1x4"]}]}))
    cache.mkdir()
    env = {**os.environ, "BUILD_PLAN": str(plan), "BUILD_SOURCE": str(source), "BUILD_CACHE": str(cache),
           "BUILD_OUT": str(cache / "served"), "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, str(NODE_SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1, p.stderr
    assert lines[0].startswith("build-engines: mlp: no GPU visible") and "fix:" in lines[0]
    assert list(cache.iterdir()) == [] and p.stdout == ""


def test_node_build_script_refuses_another_onnx_and_never_leaves_a_partial_engine(tmp_path):
    """With a stand-in GPU (nvidia-smi) and trtexec that fails: one line naming the model and the
    fix, and no engine, partial or whole, anywhere."""
    bin_dir, source, cache = tmp_path / "bin", tmp_path / "engines", tmp_path / "cache"
    for d in (bin_dir, source / "mlp" / "1", cache):
        d.mkdir(parents=True)
    _exe(bin_dir / "nvidia-smi", "echo 'Tesla T4'")
    _exe(bin_dir / "trtexec", 'case "$*" in *--help*) echo "&&&& RUNNING TensorRT.trtexec [TensorRT v100500]";;\n'
                              '*) for a in "$@"; do case $a in --saveEngine=*) echo half > "${a#*=}";; esac; done\n'
                              '   echo "[E] Error[4]: out of memory while building"; exit 1;; esac')
    (source / "mlp" / "1" / "model.onnx").write_bytes(b"onnx bytes")
    digest = hashlib.sha256(b"onnx bytes").hexdigest()
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "BUILD_SOURCE": str(source), "BUILD_CACHE": str(cache),
           "BUILD_OUT": str(cache / "served"), "BUILD_PLAN": str(tmp_path / "plan.json")}

    def run(sha: str, tensorrt: str | None = None):
        (tmp_path / "plan.json").write_text(json.dumps({"tensorrt": tensorrt, "models": [
            {"name": "mlp", "sha256": sha, "args": []}]}))
        return subprocess.run([sys.executable, str(NODE_SCRIPT)], env=env, capture_output=True, text=True,
                              timeout=60)

    p = run("0" * 64)
    assert p.returncode == 1 and "mlp:" in p.stderr and "not the ONNX the plan was made from" in p.stderr
    p = run(digest, tensorrt="10.7")
    assert p.returncode == 1 and "TensorRT 10.5.0" in p.stderr and "engines.build.image" in p.stderr
    p = run(digest)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1 and "mlp: TensorRT 10.5.0 could not build" in lines[0]
    assert "fix: lower build.workspace_mb" in lines[0]
    assert not [f for f in cache.rglob("*") if f.is_file()]


def _exe(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


# -- the archive: written by deploy, uploaded, fetched by the pod -----------------------------------

class _Store(http.server.BaseHTTPRequestHandler):
    """A WebDAV-like folder: PUT stores, GET returns (what object storage with a pre-signed URL does)."""

    files: dict[str, bytes] = {}

    def do_PUT(self):  # noqa: N802
        self.files[self.path] = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        self.end_headers()

    def do_GET(self):  # noqa: N802
        data = self.files.get(self.path)
        self.send_response(200 if data is not None else 404)
        self.end_headers()
        self.wfile.write(data or b"")

    def log_message(self, *args):
        pass


def test_archive_is_reproducible_and_travels_to_the_pod(workdir, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Store)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/edge/models.tar.gz"
    try:
        _spec(workdir, {"engines": {"source": "fetch", "url": url}})
        p = tritonkit("deploy", "--dry-run", "--out", "out", cwd=workdir)
        assert p.returncode == 0, p.stderr
        archive = workdir / "out" / "models.tar.gz"
        sha = hashlib.sha256(archive.read_bytes()).hexdigest()
        values = yaml.safe_load((workdir / "out" / "values.yaml").read_text())
        assert values["engines"]["fetch"]["sha256"] == sha and sha in p.stdout  # pinned: the pod checks it
        with tarfile.open(archive) as tar:
            names = sorted(tar.getnames())
        assert names == ["mlp/1", "mlp/1/model.onnx", "seq_mean/1", "seq_mean/1/model.onnx"]
        assert bundle.write(workdir / "model_repository", ["seq_mean", "mlp"], tmp_path / "again.tar.gz") == sha

        bundle.upload(archive, url)  # what deploy does with engines.upload: true
        dest = tmp_path / "dest"
        dest.mkdir()
        env = {**os.environ, "FETCH_DEST": str(dest), "FETCH_URL": url, "FETCH_SHA256": sha,
               "FETCH_MODELS": "mlp,seq_mean"}
        f = subprocess.run([sys.executable, str(CHART / "files" / "fetch_engines.py")], env=env,
                           capture_output=True, text=True, timeout=60)
        assert f.returncode == 0, f.stderr
        for m in ("mlp", "seq_mean"):
            assert (dest / m / "1" / "model.onnx").read_bytes() == \
                (workdir / "model_repository" / m / "1" / "model.onnx").read_bytes()
    finally:
        server.shutdown()


# -- preflight against a stand-in kubectl -------------------------------------------------------------

NODE = {"metadata": {"name": "edge-1", "labels": {"kubernetes.io/arch": "amd64"}},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}, "nodeInfo": {"architecture": "amd64"}}}


def _kubectl(bin_dir: Path, nodes: list[dict], runtime_classes: list[str]) -> Path:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nodes.json").write_text(json.dumps({"items": nodes}))
    (bin_dir / "rc.json").write_text(json.dumps({"items": [{"metadata": {"name": n}} for n in runtime_classes]}))
    exe = bin_dir / "kubectl"
    _exe(exe, f'echo "$@" >> {bin_dir}/calls\ncase "$*" in\n  *"get nodes"*) cat {bin_dir}/nodes.json;;\n'
              f'  *"get runtimeclass"*) cat {bin_dir}/rc.json;;\n  *) echo "unexpected: $*" >&2; exit 1;;\nesac')
    return exe


def _kubeconfig(workdir: Path) -> Path:
    path = workdir / "kubeconfig"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": [],
                                    "users": []}))
    return path


def test_preflight_stops_a_deploy_the_cluster_cannot_run(workdir):
    _spec(workdir, {"runtime_class": "nvidia"})
    kubectl = _kubectl(workdir / "standin", [NODE], [])
    p = tritonkit("deploy", "--kubeconfig", str(_kubeconfig(workdir)), "--kubectl", str(kubectl), cwd=workdir)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    lines = [line.strip() for line in p.stderr.splitlines()[1:]]
    assert p.stderr.splitlines()[0] == "tritonkit: error: preflight: nothing was installed:"
    assert len(lines) == 3, p.stderr
    assert lines[0].startswith("no node offers 1 nvidia.com/gpu") and "device plugin" in lines[0]
    assert lines[1].startswith("no RuntimeClass 'nvidia'") and "deploy.runtime_class" in lines[1]
    assert lines[2].startswith("engines.source hostPath") and "engines.source: fetch" in lines[2]
    assert "get nodes -o json" in (workdir / "standin" / "calls").read_text()


def test_preflight_passes_a_cluster_that_has_what_the_release_needs(workdir):
    gpu_node = {**NODE, "metadata": {"name": os.uname().nodename, "labels": {"nvidia.com/cuda.driver.major": "560"}},
                "status": {**NODE["status"], "allocatable": {"nvidia.com/gpu": "1"}}}
    from tritonkit.helm import preflight
    from tritonkit.support import Target as T

    kubectl = _kubectl(workdir / "standin", [gpu_node], ["nvidia"])
    values = {"gpu": {"count": 1}, "runtimeClassName": "nvidia", "engines": {"source": "hostPath",
                                                                            "hostPath": {"path": "/x"}}}
    assert preflight.run(values, T(BY_RELEASE["24.10"], "x86", True), kubectl=str(kubectl)) == []
    arm = T(BY_RELEASE["24.10"], "jetson", True)  # an igpu image is arm64 only
    (finding,) = preflight.run(values, arm, kubectl=str(kubectl))
    assert "the nodes are amd64" in finding and "deploy.platform" in finding
    old = {**gpu_node, "metadata": {**gpu_node["metadata"], "labels": {"nvidia.com/cuda.driver.major": "535"}}}
    kubectl = _kubectl(workdir / "standin", [old], ["nvidia"])
    (finding,) = preflight.run(values, T(BY_RELEASE["24.10"], "x86", True), kubectl=str(kubectl))
    assert "driver is 535" in finding and "560" in finding
