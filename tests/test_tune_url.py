"""`tritonkit tune --url`: the offline search against a Triton the kit did not start, through its
repository API. The server here is a real tritonserver the test starts (as `tritonkit serve` would
in another shell); the tune runs as a user runs it, the real `tritonkit` command."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from google.protobuf import json_format

from tests.conftest import tritonkit, write_spec
from tritonkit.benchmarks.remote import SteadyLoad
from tritonkit.clients import Client
from tritonkit.configs.generate import generate
from tritonkit.configs.loader import load_spec
from tritonkit.server import _stub_env, find_install, free_port, prepare_backends
from tritonkit.serving import running

NAIVE = {"max_queue_delay_us": 0}  # the config a new user writes first: batch 16, no delay, one instance
SPEC = {
    "models": [
        {"name": "remote_mlp", "onnx": "onnx/mlp.onnx", "max_batch_size": 16, "batching": NAIVE,
         "slo": {"p95_ms": 25}},
        {"name": "bystander", "onnx": "onnx/mlp.onnx", "max_batch_size": 8, "batching": NAIVE},
        {"name": "not_served", "onnx": "onnx/mlp.onnx", "max_batch_size": 8, "slo": {"p95_ms": 25}},
    ],
    "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0},
}


class UsersServer:
    """The user's server: two of the spec's three models loaded, the repository API behind a key.
    It is not the kit's: nothing the kit does can stop it, since the repository API has no shutdown.
    Triton 2.51 itself can crash (its python backend, stubs starting while others serve); `live()`
    then starts a fresh one, so that one crash fails no test but the one it happened under."""

    def __init__(self, root: Path, spec_path: Path):
        self.root, self.spec_path = root, spec_path
        self._stack = contextlib.ExitStack()
        self.r = None

    def live(self):
        why = self.died()
        if self.r is not None and why is None:
            return self.r
        if why:
            print(f"the user's tritonserver is gone ({why}); starting a fresh one")
        self._stack.close()
        self.r = self._stack.enter_context(running(load_spec(self.spec_path), self.root / "repo",
                                                   self.root / "state", models=["remote_mlp", "bystander"]))
        self.r.root, self.r.spec_path = self.root, self.spec_path
        self.r.env = {"TRITONKIT_API_KEY": self.r.endpoints.key_value, "PYTHONUNBUFFERED": "1"}
        return self.r

    def died(self) -> str | None:
        """Why the server is gone (its exit code and the telling line of its log), or None."""
        if self.r is None or self.r.server.alive():
            return None
        return f"exit code {self.r.server.proc.returncode}: {self.r.server.failure_reason()}"

    def close(self) -> None:
        self._stack.close()


@pytest.fixture(scope="module")
def users(tmp_path_factory, onnx_dir):
    root = tmp_path_factory.mktemp("remote")
    (root / "onnx").symlink_to(onnx_dir)
    spec_path = write_spec(root, SPEC)
    generate(load_spec(spec_path, root / "repo"), root / "repo")
    u = UsersServer(root, spec_path)
    try:
        yield u
    finally:
        u.close()


@pytest.fixture
def server(users):
    return users.live()


def surviving_a_crash(users, tmp_path, attempt_fn):
    """`attempt_fn(server, out)` once, and once more on a fresh server where Triton itself crashed
    under the first (the crash's reason printed): what the kit does to a server it cannot restart
    is checked by the tests that stop one on purpose, never by one Triton's own crash."""
    result = attempt_fn(users.live(), tmp_path / "out")
    why = users.died()
    if why is None:
        return users.r, tmp_path / "out", result
    print(f"tritonserver crashed under the tune ({why}): once more on a fresh one")
    result = attempt_fn(users.live(), tmp_path / "again")
    assert users.died() is None, f"tritonserver crashed under the tune twice: {users.died()}"
    return users.r, tmp_path / "again", result


def served_config(r, model: str = "remote_mlp") -> dict:
    with r.client() as c:
        return json_format.MessageToDict(c.config(model), preserving_proto_field_name=True)


def shadow_loaded(r) -> bool:
    with r.client() as c:
        return c.model_ready("remote_mlp__tune")


def tune_args(r, *more: str, out: Path) -> list[str]:
    return ["tune", "--url", r.endpoints.grpc, "--model", "remote_mlp", "--spec", str(r.spec_path),
            "--repo", str(r.root / "repo"), "--out", str(out), *more]


def test_flags_that_mean_nothing_in_a_mode_are_refused(tmp_path):
    cases = [
        (["tune", "--model", "m", "--dry-run"], "--dry-run"),  # online-only, offline on the kit's server
        (["tune", "--model", "m", "--in-place"], "--in-place"),  # needs --url
        (["tune", "--model", "m", "--online", "--max-trials", "9"], "--max-trials"),
        (["tune", "--mix", "--url", "127.0.0.1:1"], "--url"),
        (["tune", "--model", "m", "--url", "127.0.0.1:1", "--interval", "3"], "--interval"),
    ]
    for args, flag in cases:
        r = tritonkit(*args, "--spec", str(tmp_path / "none.yaml"), timeout=60)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert flag in r.stderr and "means nothing" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_bad_servers_and_keys_exit_2_and_change_nothing(server, tmp_path):
    before = served_config(server)
    cases = [
        ({}, ["--url", f"127.0.0.1:{free_port()}"], "no Triton answers"),
        ({"TRITONKIT_API_KEY": "not-the-key"}, [], "refused the repository API's key"),
        ({}, ["--model", "not_served"], "is not loaded"),
        ({}, ["--repo", str(tmp_path)], "has no version folder"),
    ]
    for env, more, text in cases:
        args = tune_args(server, out=tmp_path / "out")
        for flag, value in zip(more[::2], more[1::2]):  # the case's flag replaces the default one
            args[args.index(flag) + 1] = value
        r = tritonkit(*args, env={**server.env, **env}, timeout=120)
        assert r.returncode == 2, (more, r.stdout, r.stderr)
        assert text in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert served_config(server) == before and not shadow_loaded(server)


def test_a_server_without_explicit_model_control_is_refused(server, tmp_path):
    """A real tritonserver in poll mode, on the same repository: the tune says how to start it."""
    install = prepare_backends(find_install(), tmp_path / "state")
    grpc, http = free_port(), free_port()
    proc = subprocess.Popen(
        [str(install.binary), f"--model-repository={server.root / 'repo'}", "--model-control-mode=poll",
         f"--grpc-port={grpc}", f"--http-port={http}", "--allow-metrics=false",
         f"--backend-directory={install.backend_dir}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_stub_env(install), start_new_session=True)
    try:
        with Client(f"127.0.0.1:{grpc}") as c:
            deadline = time.monotonic() + 120
            while not c.model_ready("remote_mlp") and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.2)
            before = c.config("remote_mlp")
            args = tune_args(server, out=tmp_path / "out")
            args[args.index("--url") + 1] = f"127.0.0.1:{grpc}"
            r = tritonkit(*args, env=server.env, timeout=120)
            assert r.returncode == 2, r.stdout + r.stderr
            assert "--model-control-mode=explicit" in r.stderr and "Traceback" not in r.stderr, r.stderr
            assert c.config("remote_mlp") == before
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(30)
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None


def test_tune_runs_on_a_shadow_copy_and_leaves_live_traffic_alone(users, tmp_path):
    def attempt(server, out):
        before = served_config(server)
        with server.client() as c:
            live_before = c.statistics("remote_mlp")["inference_stats"]["success"]["count"]
        with SteadyLoad(server.endpoints.grpc, "bystander", 100) as load:
            r = tritonkit(*tune_args(server, "--max-trials", "8", "--max-trial-s", "1", out=out),
                          env=server.env, timeout=600)
        return before, live_before, load, r

    server, out, (before, live_before, load, r) = surviving_a_crash(users, tmp_path, attempt)
    assert r.returncode in (0, 1), r.stdout + r.stderr  # 1: nothing confirmed on a busy machine
    assert "Traceback" not in r.stderr
    assert "as shadow copy remote_mlp__tune" in r.stdout and "the original config is in force (verified)" in r.stdout
    # the bystander served every request of the whole tune, and the tuned model got none of the trials'
    assert load.ok > 100 and not load.failed, (load.ok, load.failed[:3])
    with server.client() as c:
        assert c.statistics("remote_mlp")["inference_stats"]["success"]["count"] == live_before
    assert served_config(server) == before and not shadow_loaded(server)
    log = (out / "trials.json").read_text()
    assert '"tuned_as": "shadow copy remote_mlp__tune"' in log and '"backend": "python"' in log
    assert "Server: Triton 2.51" in (out / "report.md").read_text()


def test_ctrl_c_in_place_puts_the_original_config_back(users, tmp_path):
    """Interrupted once its trials have changed the served model itself: the original is back."""
    def attempt(server, out):
        before = served_config(server)
        exe = Path(sys.executable).parent / "tritonkit"
        # SIGINT as on a terminal: a suite started from a background job inherits it ignored
        proc = subprocess.Popen([str(exe), *tune_args(server, "--in-place", out=out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **server.env},
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        seen = []
        for line in proc.stdout:  # synchronised on the tune's own output: the second trial has run
            seen.append(line)
            if line.lstrip().startswith("trial   2"):
                break
        changed = served_config(server) if users.died() is None else None
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=120)
        return before, changed, proc.returncode, "".join(seen) + rest, err

    server, _, (before, changed, code, out, err) = surviving_a_crash(users, tmp_path, attempt)
    assert code == 130, out + err
    assert changed != before  # the calibration's config was in force on the model itself
    assert "the original config is in force (verified)" in out, out + err
    assert served_config(server) == before


def test_sweep_url_measures_rows_on_a_shadow_copy(server, tmp_path):
    before = served_config(server)
    r = tritonkit("sweep", "--url", server.endpoints.grpc, "--model", "remote_mlp", "--spec", str(server.spec_path),
                  "--repo", str(server.root / "repo"), "--rps", "100", "--duration", "1", "--warmup", "0.5",
                  "--max-batch", "2", "--out", str(tmp_path / "sweep"), env=server.env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[2/2] max_batch  2" in r.stdout and "peak RSS" not in r.stdout  # not this machine's process to read
    assert (tmp_path / "sweep" / "report.md").is_file()
    assert served_config(server) == before and not shadow_loaded(server)
