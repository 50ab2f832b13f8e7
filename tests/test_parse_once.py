"""Each command parses deploy.yaml once, at its boundary, and hands the resolved spec to its stages.

`configs`, `validate` and `build` run in-process through `tritonkit.cli.main` and read the parse
counter; `serve` and `tune` run as the console script with TRITONKIT_TRACE_PARSES, which makes
every parse append a line to a file (the demo's count is checked by its one whole run,
tests/test_cli_serve.py). All of them go the real command path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import tritonkit, write_spec
from tests.test_build_engines import static_reshape
from tritonkit import spec as spec_module
from tritonkit.cli import main

SMALL = {"models": [{"name": "m", "onnx": "onnx/mlp.onnx", "max_batch_size": 2,
                     "batching": {"max_queue_delay_us": 500}, "slo": {"p95_ms": 200, "rps": 50}}],
         "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0}}


def _parses(*argv: str) -> int:
    before = spec_module.parse_count()
    assert main(list(argv)) == 0
    return spec_module.parse_count() - before


def _traced(workdir: Path) -> tuple[Path, dict]:
    trace = workdir / "parses.log"
    return trace, {**os.environ, spec_module.TRACE_ENV: str(trace)}


def _count(trace: Path) -> int:
    return len(trace.read_text().splitlines()) if trace.exists() else 0


def _run_until(workdir: Path, args: list[str], needle: str, sig: int, timeout: float = 300) -> str:
    """Start the console script, wait for `needle` in its output, send `sig`, wait for the exit."""
    trace, env = _traced(workdir)
    exe = Path(sys.executable).parent / "tritonkit"
    proc = subprocess.Popen([str(exe), *args], cwd=workdir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen = ""
    try:
        for line in proc.stdout:
            seen += line
            if needle in line:
                proc.send_signal(sig)
                break
        seen += proc.communicate(timeout=timeout)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert needle in seen, seen[-3000:]
    return seen


def test_configs_validate_and_build_parse_once(workdir):
    path = write_spec(workdir, SMALL)
    repo = str(workdir / "repo")
    assert _parses("configs", "--spec", str(path), "--out", repo) == 1
    assert _parses("validate", "--spec", str(path), "--repo", repo) == 1
    assert _parses("build", "--spec", str(path), "--out", repo) == 1


@pytest.mark.server
def test_serve_parses_once(workdir):
    write_spec(workdir, SMALL)
    _run_until(workdir, ["serve", "--spec", "deploy.yaml", "--repo", "repo", "--state-dir", "state"],
               "Ctrl-C stops the server", signal.SIGTERM)
    assert _count(workdir / "parses.log") == 1


@pytest.mark.server
def test_tune_after_build_on_a_batch_1_export_succeeds_and_parses_once(workdir, probed):
    """A model exported with its batch fixed at 1: `build` makes the batch dynamic, and `tune`
    then tunes the prepared graph, not the original it would refuse."""
    static_reshape(workdir / "static.onnx")
    write_spec(workdir, {"models": [{"name": "st", "onnx": "static.onnx", "max_batch_size": 8,
                                     "batching": {"max_queue_delay_us": 500}, "slo": {"p95_ms": 200}}],
                         "server": SMALL["server"]})
    assert tritonkit("build", "--spec", "deploy.yaml", "--out", "repo", cwd=workdir).returncode == 0
    trace, env = _traced(workdir)
    done = tritonkit("tune", "--spec", "deploy.yaml", "--model", "st", "--repo", "repo", "--state-dir", "state",
                     "--out", "out", "--rps", "50", "--max-trials", "9", "--max-trial-s", "1", cwd=workdir, env=env,
                     timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert (workdir / "tuned.yaml").is_file() and "wrote" in done.stdout
    assert _count(trace) == 1
