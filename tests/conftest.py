"""Shared fixtures. The `triton` fixture is one real tritonserver for the whole session, started
on free ports and always stopped by its own pid (LocalTriton.stop)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import models

REPO_ROOT = Path(__file__).resolve().parent.parent

# One spec exercising every dynamic_batching field; the server tests read these values back.
SERVED_SPEC = {
    "models": [
        {
            "name": "all_fields",
            "onnx": "onnx/mlp.onnx",
            "max_batch_size": 8,
            "response_cache": True,
            "instances": {"count": 2},
            "batching": {
                "preferred_batch_sizes": [2, 4],
                "max_queue_delay_us": 1500,
                "priority_levels": 3,
                "default_priority": 2,
                "default_queue_policy": {"timeout_action": "REJECT", "default_timeout_us": 100000,
                                         "allow_timeout_override": True, "max_queue_size": 20},
                "priority_queue_policies": {
                    1: {"timeout_action": "DELAY", "default_timeout_us": 300000,
                        "allow_timeout_override": False, "max_queue_size": 10},
                    3: {"max_queue_size": 5, "default_timeout_us": 2000, "allow_timeout_override": True},
                },
            },
        },
        {
            "name": "ordered",
            "onnx": "onnx/mlp.onnx",
            "max_batch_size": 4,
            "batching": {"preserve_ordering": True, "priority_levels": 1, "default_priority": 1,
                         "max_queue_delay_us": 500},
        },
        {
            # a slow model: even when a busy box lets the client's sends trickle out, each one
            # finds the single instance busy and the 2-deep queue full
            "name": "tiny_queue",
            "onnx": "onnx/mlp_slow.onnx",
            "max_batch_size": 1,
            "batching": {"default_queue_policy": {"max_queue_size": 2}},
        },
        {
            "name": "seq_mean",
            "onnx": "onnx/seq_mean.onnx",
            "max_batch_size": 8,
            "inputs": [{"name": "x", "dims": [-1], "min": [1], "opt": [4], "max": [16]}],
            "batching": {"max_queue_delay_us": 20000, "preferred_batch_sizes": [3]},
        },
        {
            "name": "reloadable",
            "onnx": "onnx/mlp.onnx",
            "max_batch_size": 8,
            "batching": {"max_queue_delay_us": 1000},
        },
        {
            "name": "lookup",
            "onnx": "onnx/lookup.onnx",
            "max_batch_size": 8,
            "warmup": False,  # random ids would fall outside the table
            "batching": {"max_queue_delay_us": 20000, "preferred_batch_sizes": [4]},
        },
        {
            # Two instances: with one, Triton 2.51's batcher misses the wake-up when an instance
            # frees up while a queue policy is set, and stalls up to 500 ms (docs/overload.md), which
            # would drown the priority ordering this model is for.
            "name": "prio",
            "onnx": "onnx/mlp_slow.onnx",
            # A slow model, one request per execution: the tests' 1500 req/s are a hard overload
            # on any machine and well within what the load generators send on a busy one, so the
            # queue is always full and the order in it decides the latency.
            "max_batch_size": 1,
            "instances": {"count": 2},
            "batching": {"priority_levels": 2, "default_priority": 2, "default_queue_policy": {"max_queue_size": 24}},
        },
        # Tests that change a model's config each have a model of their own (reloadable, sweepable,
        # online, online_rules), so the order of tests never matters; the others only read.
        {
            "name": "steady",
            "onnx": "onnx/mlp.onnx",
            "max_batch_size": 8,
            "batching": {"max_queue_delay_us": 1000},
        },
        {
            "name": "sweepable",
            "onnx": "onnx/mlp.onnx",
            "max_batch_size": 8,
            "batching": {"max_queue_delay_us": 1000},
        },
        {
            # the online tuner's: a 20 ms queue delay misses a 15 ms SLO at light load
            "name": "online",
            "onnx": "onnx/mlp_big.onnx",
            "max_batch_size": 16,
            "instances": {"count": 2},
            "batching": {"preferred_batch_sizes": [16], "max_queue_delay_us": 20000},
            "slo": {"p95_ms": 15},
        },
        {
            # the online controller's rules, applied through model control
            "name": "online_rules",
            "onnx": "onnx/mlp.onnx",
            "max_batch_size": 16,
            "batching": {"preferred_batch_sizes": [16], "max_queue_delay_us": 20000},
            "slo": {"p95_ms": 15},
        },
    ],
    "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0},
}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the items
def pytest_collection_modifyitems(items):
    """The suite runs in two workers (pytest-xdist, `--dist loadgroup`). Tests that assert a measured
    latency or throughput (marker `measures`) share one group, so they run one at a time in one
    worker, never beside each other; every other test goes with its module, so a module's fixtures
    (a served repository, a built site) are made once."""
    for item in items:
        group = "measures" if item.get_closest_marker("measures") else item.module.__name__
        item.add_marker(pytest.mark.xdist_group(group))


def _shared(tmp_path_factory) -> Path:
    """A folder every worker of this run sees (xdist gives each worker a base of its own under one root)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def probe_cache(tmp_path_factory) -> Path:
    """`tritonkit probe`'s answers go to a cache of this run's own, shared by its workers: the first
    test that needs them (a tune, the probe test) measures the bundled server once; no test reads
    a user's cache."""
    path = _shared(tmp_path_factory) / "probe_cache"
    path.mkdir(exist_ok=True)
    os.environ["TRITONKIT_CACHE"] = str(path)  # inherited by every `tritonkit` the tests start
    return path


@pytest.fixture(scope="session")
def probed(probe_cache, tmp_path_factory) -> dict:
    """`tritonkit probe` run once per test run, as a user runs it: its cache entry for the bundled
    server. Tests that tune ask for it, so that the tuner reads the cache instead of probing again;
    a worker that finds the probe done (or under way, behind the lock) reads what it wrote."""
    console = probe_cache / "probe.stdout"
    with open(probe_cache / "probe.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not console.exists():
            r = tritonkit("probe", "--state-dir", str(tmp_path_factory.mktemp("probe_state")), timeout=300)
            assert r.returncode == 0, r.stdout + r.stderr
            console.write_text(r.stdout)
    data = json.loads((probe_cache / "server-probe.json").read_text())
    (version, entry), = data["versions"].items()
    return {"stdout": console.read_text(), "version": version, **entry}


def write_spec(folder: Path, data: dict) -> Path:
    path = folder / "deploy.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def onnx_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("onnx_models")
    models.mlp(d / "mlp.onnx", width=256, layers=2)
    models.mlp(d / "mlp_big.onnx", width=1024, layers=4)
    models.mlp(d / "mlp_slow.onnx", width=2048, layers=4)
    models.seq_mean(d / "seq_mean.onnx")
    models.two_input_int64(d / "two_input.onnx")
    models.lookup(d / "lookup.onnx")
    return d


@pytest.fixture
def workdir(tmp_path, onnx_dir) -> Path:
    """A folder with onnx/ beside where deploy.yaml goes, like a user's checkout."""
    (tmp_path / "onnx").symlink_to(onnx_dir)
    return tmp_path


@pytest.fixture(scope="session")
def served(tmp_path_factory, onnx_dir):
    """The SERVED_SPEC models generated into a repository and served by a real tritonserver."""
    from tritonkit.configs.generate import generate
    from tritonkit.configs.loader import load_spec
    from tritonkit.serving import running

    root = tmp_path_factory.mktemp("served")
    (root / "onnx").symlink_to(onnx_dir)
    spec_path = write_spec(root, SERVED_SPEC)
    generate(load_spec(spec_path, root / "repo"), root / "repo")
    spec = load_spec(spec_path)
    with running(spec, root / "repo", root / "state") as r:
        r.spec_path = spec_path
        r.repo = root / "repo"
        yield r


def tritonkit(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300):
    """Run the real `tritonkit` console script."""
    exe = Path(sys.executable).parent / "tritonkit"
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
