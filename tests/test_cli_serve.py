"""`tritonkit serve` and `tritonkit infer` as a user runs them, and the failures they report."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import tritonkit, write_spec

pytestmark = pytest.mark.server

SMALL = {"models": [{"name": "m", "onnx": "onnx/mlp.onnx", "max_batch_size": 4}],
         "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0}}


def _start_serve(workdir: Path, *extra: str) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "tritonkit"
    return subprocess.Popen([str(exe), "serve", "--spec", "deploy.yaml", "--repo", "repo", "--state-dir", "state",
                             *extra], cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(proc: subprocess.Popen, needle: str, timeout: float = 120) -> str:
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen += line
        if needle in line:
            return seen
    proc.kill()
    raise AssertionError(f"never printed {needle!r}:\n{seen}\n{proc.stderr.read()}")


def _stubs_under(folder: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(folder) in cmd:
            found.append(p)
    return found


def test_serve_infer_and_sigterm_leave_no_process(workdir):
    write_spec(workdir, SMALL)
    proc = _start_serve(workdir)
    try:
        banner = _wait_for(proc, "Ctrl-C stops the server")
        assert "HTTP     http://127.0.0.1:" in banner and "loaded m" in banner
        state = json.loads((workdir / "state/server.json").read_text())
        assert oct((workdir / "state/server.json").stat().st_mode & 0o777) == "0o600"
        server_pid = state["pid"]
        assert psutil.pid_exists(server_pid)
        stubs = [p for p in _stubs_under(workdir / "state") if p.pid != server_pid]
        assert stubs, "the python-backend stub should be running"

        res = tritonkit("infer", "--model", "m", "--state-dir", str(workdir / "state"), "--batch", "3")
        assert res.returncode == 0, res.stderr
        assert "output output: [3, 256] float32" in res.stdout
        res = tritonkit("infer", "--model", "m", "--state-dir", str(workdir / "state"), "--protocol", "http")
        assert res.returncode == 0 and "via http" in res.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert proc.returncode == 0, proc.stderr.read()
    assert not psutil.pid_exists(server_pid) or psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE
    assert not [p for p in _stubs_under(workdir / "state") if p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE], "stubs outlived the server"
    assert not (workdir / "state/server.json").exists()


def _kit(workdir: Path, *args: str) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "tritonkit"
    return subprocess.Popen([str(exe), *args], cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for_server(kit: subprocess.Popen, state: Path, timeout: float = 120) -> list[psutil.Process]:
    """The server that `kit` started and its stubs, once the server wrote its state and a stub runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert kit.poll() is None, f"the command exited with {kit.returncode} before its server was up"
        with contextlib.suppress(OSError, ValueError, KeyError):
            server = psutil.Process(json.loads((state / "server.json").read_text())["pid"])
            family = [server, *server.children(recursive=True)]
            if len(family) > 1:
                return family
        time.sleep(0.2)
    kit.kill()
    raise AssertionError("no server with a stub came up")


@pytest.mark.parametrize("command", [
    ["serve", "--spec", "deploy.yaml", "--repo", "repo", "--state-dir", "state"],
    ["loadtest", "--spec", "deploy.yaml", "--repo", "repo", "--state-dir", "state", "--model", "m",
     "--rps", "20", "--duration", "120", "--engine", "asyncio", "--out", "out"],
], ids=["serve", "loadtest"])
def test_a_killed_kit_command_leaves_no_server_behind(workdir, command):
    """SIGKILL (or the OOM killer) gives the kit no chance to stop its server: the server goes
    with it all the same, and its python-backend stubs follow, within 5 s."""
    write_spec(workdir, SMALL)
    kit = _kit(workdir, *command)
    family = _wait_for_server(kit, workdir / "state")
    kit.kill()
    kit.wait(10)
    gone, alive = psutil.wait_procs(family, timeout=5)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"outlived the killed command by 5 s: {[(p.pid, p.name()) for p in alive]}"


def test_port_in_use_is_one_clear_message(workdir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        write_spec(workdir, SMALL)
        res = tritonkit("serve", "--spec", "deploy.yaml", "--repo", "repo", "--state-dir", "state",
                        "--http-port", str(port), cwd=workdir)
    assert res.returncode == 1
    assert f"port {port} (server.http_port) is already in use" in res.stderr
    assert "Traceback" not in res.stderr


def test_missing_binary_is_one_clear_message(workdir):
    write_spec(workdir, SMALL)
    res = tritonkit("serve", "--spec", "deploy.yaml", "--repo", "repo", "--state-dir", "state", cwd=workdir,
                    env={"TRITONSERVER": str(workdir / "no/tritonserver")})
    assert res.returncode == 1
    assert "is not an executable file" in res.stderr and "Traceback" not in res.stderr


def test_model_that_fails_to_load_names_tritons_cause(workdir):
    """The bundled server has no onnxruntime backend: Triton's own reason reaches the user."""
    spec = {**SMALL, "models": [{**SMALL["models"][0], "runtime": "onnxruntime"}]}
    write_spec(workdir, spec)
    res = tritonkit("serve", "--spec", "deploy.yaml", "--repo", "repo", "--state-dir", "state", cwd=workdir)
    assert res.returncode == 1
    assert "model 'm' failed to load:" in res.stderr and "onnxruntime" in res.stderr
    assert "Traceback" not in res.stderr
    # and the server it started is gone
    assert not [p for p in _stubs_under(workdir / "state") if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_infer_without_a_server_says_how_to_start_one(tmp_path):
    res = tritonkit("infer", "--model", "m", "--state-dir", str(tmp_path / "state"))
    assert res.returncode == 2 and "tritonkit serve" in res.stderr


@pytest.mark.measures
def test_demo_finishes_and_batches(tmp_path, probed):
    """`make demo`'s job on a small copy of the default spec, the demo's one whole run in the suite:
    batches above 1 in Triton's stats, a burst the batcher never stalls on (a stall is a request
    held ~500 ms, docs/overload.md), the tuned config served behind Envoy, and deploy.yaml parsed
    once for all eight steps."""
    from tritonkit import spec as spec_module

    root = Path(__file__).resolve().parent.parent
    spec = (root / "deploy.yaml").read_text()
    (tmp_path / "deploy.yaml").write_text(spec)
    trace = tmp_path / "parses.log"
    env = {**os.environ, spec_module.TRACE_ENV: str(trace)}
    res = tritonkit("demo", "--spec", "deploy.yaml", "--repo", "repo", "--state-dir", "state",
                    "--requests", "600", "--concurrency", "16", "--seconds", "1", "--tune-trials", "9",
                    cwd=tmp_path, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    hist = [ln for ln in res.stdout.splitlines() if "|" in ln]
    sizes = [int(ln.split("|")[0]) for ln in hist]
    assert sizes and max(sizes) > 1, res.stdout
    # a stall holds a request about 500 ms, dozens of times the burst's P95: a wide factor tells it
    p95, burst_max = map(float, re.search(r"P95 ([0-9.]+) ms .*max ([0-9.]+) ms", res.stdout).groups())
    assert burst_max < 10 * max(p95, 5.0), res.stdout
    assert "P95" in res.stdout and "tritonserver stopped" in res.stdout
    # the tune's verdict: one "kept" row for a start config that stays, else a before and an after
    # that differ (never two P95s of one config shown as a change)
    tune = res.stdout.split("tune for the SLO")[-1].splitlines()
    rows = {ln.split()[0]: ln.split("P95")[0].split(None, 1)[1].strip() for ln in tune
            if ln.strip().startswith(("kept ", "before ", "after "))}
    assert list(rows) in (["kept"], ["before", "after"]), res.stdout
    assert rows.get("before") != rows.get("after") or "kept" in rows
    # behind the gateway: the tuned limit, Triton's queues as `serve` writes them there, and answers
    # through Envoy within the SLO
    gateway = res.stdout.split("the gateway: the tuned config behind Envoy")[-1]
    assert re.search(r"gateway \S+: \d+ bulk \+ \d+ interactive in flight", gateway), res.stdout
    assert "Triton's queues: priority levels, no queue policy" in gateway
    within = re.search(r"offered \d+ req/s: (\d+) req/s answered within 25 ms", gateway)
    assert within and int(within.group(1)) > 0, gateway
    assert len(trace.read_text().splitlines()) == 1  # one parse at the command's boundary
