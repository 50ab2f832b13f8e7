"""Ready means ready: `tritonkit serve` loads every model and pipeline before the server says ready
(`--load-model` at start, strict readiness), so the first request sent the moment
/v2/health/ready turns 200 is answered, for each of six models and a pipeline. A model that fails
to load at start fails the start with an error naming it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
from onnx import TensorProto, helper

from tests import pipeline_models as pm
from tests.conftest import write_spec
from tritonkit.clients import Client
from tritonkit.errors import ServerError
from tritonkit.server import free_port

pytestmark = pytest.mark.server

# six models built with the onnx helper; three of them are the camera pipeline's steps
EXTRA = ("relay", "int_head", "ids_and_mask")


def _first_requests() -> dict[str, dict[str, np.ndarray]]:
    """One request per served name, made here from the graphs' shapes: nothing is asked of the
    server before its inference request."""
    rng = np.random.default_rng(0)
    feat = rng.standard_normal((1, pm.FEATURES)).astype(np.float32)
    ids = rng.integers(0, 9, (1, 5)).astype(np.int64)
    return {
        "backbone": {"pixels": rng.standard_normal((1, 32)).astype(np.float32)},
        "box_head": {"feat": feat},
        "class_head": {"feat": feat},
        "relay": {"x": feat},
        "int_head": {"ids": rng.integers(0, 9, (1, pm.FEATURES)).astype(np.int64)},
        "ids_and_mask": {"ids": ids, "mask": np.ones_like(ids)},
        "camera": {"image": rng.standard_normal((1, 32)).astype(np.float32)},
    }


def _six_model_spec(onnx_dir: Path, extra: tuple[dict, ...] = ()) -> dict:
    models = tuple({"name": n, "onnx": str(onnx_dir / f"{n}.onnx"), "max_batch_size": 8,
                    "batching": {"max_queue_delay_us": 500}} for n in EXTRA)
    return pm.camera_spec(onnx_dir, extra_models=models + extra)


@pytest.fixture(scope="module")
def onnx_models(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ready_onnx")
    pm.write_all(d)
    return d


def _ready(http: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=1) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):  # 400 (not ready) is an HTTPError
        return False


def _left_under(folder: Path) -> list[psutil.Process]:
    """Processes (a server, its stubs) still running from `folder`."""
    left = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if str(folder) in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.NoSuchProcess:
            pass
    return left


def test_first_request_after_ready_is_answered_for_every_model_and_the_pipeline(tmp_path, onnx_models):
    write_spec(tmp_path, _six_model_spec(onnx_models))
    http, grpc, metrics = free_port(), free_port(), free_port()
    while len({http, grpc, metrics}) < 3:
        grpc, metrics = free_port(), free_port()
    exe = Path(sys.executable).parent / "tritonkit"
    proc = subprocess.Popen([str(exe), "serve", "--spec", "deploy.yaml", "--repo", "repo", "--state-dir", "state",
                             "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    requests = _first_requests()
    answers, failures = {}, {}
    try:
        deadline = time.monotonic() + 180
        while not _ready(f"127.0.0.1:{http}"):  # a readiness probe's view: nothing else is asked
            assert proc.poll() is None, f"serve exited with {proc.returncode}: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "the server never became ready"
            time.sleep(0.01)
        with Client(f"127.0.0.1:{grpc}") as c:  # the very first request to each name
            for name, arrays in requests.items():
                try:
                    answers[name] = c.infer(name, arrays)
                except Exception as e:  # noqa: BLE001 - every name's outcome is reported below
                    failures[name] = repr(e)
        banner = ""
        while "Ctrl-C stops the server" not in banner:
            line = proc.stdout.readline()
            assert line, f"serve stopped before its banner: {banner}{proc.stderr.read()}"
            banner += line
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert not failures, failures
    assert set(answers) == set(requests)
    assert answers["camera"]["boxes"].shape == (1, 4) and answers["camera"]["scores"].shape == (1, 10)
    np.testing.assert_array_equal(answers["int_head"]["out"], requests["int_head"]["ids"] + 1)
    np.testing.assert_array_equal(answers["relay"]["y"], requests["relay"]["x"])
    serving = next(ln for ln in banner.splitlines() if ln.startswith("serving "))
    for name in requests:  # the banner names every model and the pipeline
        assert name in serving, serving
    assert "pipeline(s): camera" in serving, serving
    for name in requests:
        assert f"loaded {name}" in banner, banner
    assert proc.returncode == 0, proc.stderr.read()
    assert not _left_under(tmp_path / "state"), "the server outlived serve"


def _broken(path: Path) -> Path:
    """A valid ONNX file (onnx.checker passes, so the kit's checks do) with an op ONNX Runtime does
    not have: it fails only when the server loads it."""
    graph = helper.make_graph([helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example.kit")], "broken",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("com.example.kit", 1)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def test_a_model_that_fails_to_load_at_start_fails_the_start_naming_it(tmp_path, onnx_models):
    from tritonkit.configs.loader import load_spec
    from tritonkit.configs.steps import serve_configured

    _broken(tmp_path / "broken.onnx")
    broken = {"name": "broken", "onnx": str(tmp_path / "broken.onnx"), "max_batch_size": 8, "warmup": False}
    spec = load_spec(write_spec(tmp_path, _six_model_spec(onnx_models, (broken,))), tmp_path / "repo")
    said: list[str] = []
    with pytest.raises(ServerError) as e, serve_configured(spec, tmp_path / "repo", tmp_path / "state",
                                                           log=said.append):
        pytest.fail("the server started with a model that cannot load")
    message = str(e.value)
    print(message)
    assert message.startswith("model 'broken' failed to load:"), message
    assert "Frobnicate" in message and "not a registered function/op" in message, message
    assert str(tmp_path / "state" / "tritonserver.log") in message
    for good in ("backbone", "camera", *EXTRA):  # only the model that failed is named as failing
        assert f"model '{good}'" not in message
    assert not _left_under(tmp_path / "state"), "the failed server (or a stub) is still running"


def test_a_pipeline_whose_step_fails_names_the_step(tmp_path, onnx_models):
    """The camera pipeline's backbone cannot load: the start fails naming the backbone first."""
    from tritonkit.configs.generate import generate
    from tritonkit.configs.loader import load_spec
    from tritonkit.serving import running

    spec = load_spec(write_spec(tmp_path, pm.camera_spec(onnx_models)), tmp_path / "repo")
    generate(spec, tmp_path / "repo")
    _broken(tmp_path / "repo" / "backbone" / "1" / "model.onnx")  # the served copy breaks after the checks
    with pytest.raises(ServerError) as e, running(spec, tmp_path / "repo", tmp_path / "state"):
        pytest.fail("the server started with a step that cannot load")
    message = str(e.value)
    print(message)
    assert message.startswith("model 'backbone' failed to load:"), message
    assert not _left_under(tmp_path / "state")


def _crashing_model(repo: Path, crashes: int) -> None:
    """A python-backend model whose first `crashes` loads kill the tritonserver loading it with
    SIGABRT, as 2.51's python backend aborts on a lock_exception when stubs start together on a
    busy box; later loads succeed."""
    model = repo / "crasher"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        'name: "crasher"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [{ name: "x" data_type: TYPE_FP32 dims: [1] }]\n'
        'output [{ name: "y" data_type: TYPE_FP32 dims: [1] }]\n'
        'instance_group [{ kind: KIND_CPU count: 1 }]\n')
    (model / "1" / "model.py").write_text(f'''import os, signal
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        count = Path(__file__).parent / "crashes"
        done = len(count.read_text()) if count.exists() else 0
        if done < {crashes}:
            count.write_text("x" * (done + 1))
            os.kill(os.getppid(), signal.SIGABRT)

    def execute(self, requests):
        import triton_python_backend_utils as pb_utils
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())])
                for r in requests]
''')


@pytest.mark.parametrize("crashes", [1, 2])
def test_a_server_killed_while_loading_is_started_once_more(tmp_path, crashes):
    """tritonserver killed by a signal while it loads, no model refused: started once more, and it
    answers; the crashed run's log is kept beside the new one. Killed on both tries, the error says
    how it exited and where its log is."""
    from tritonkit.server import LocalTriton
    from tritonkit.spec import ServerSpec

    _crashing_model(tmp_path / "repo", crashes)
    server = LocalTriton(tmp_path / "repo", ServerSpec(), tmp_path / "state", http_port=0, grpc_port=0,
                         metrics_port=0, models=["crasher"])
    if crashes == 1:
        with server:
            with Client(server.endpoints.grpc) as c:
                out = c.infer("crasher", {"x": np.array([2.5], np.float32)})
            assert out["y"].tolist() == [2.5]
    else:
        with pytest.raises(ServerError, match=r"exited with code -6 while starting.*full log"):
            server.start()
        assert server.proc is None  # the second server was stopped too
    assert (tmp_path / "state" / "tritonserver.crashed-1.log").exists()


def test_a_killed_servers_shared_memory_is_removed_when_it_is_stopped(tmp_path):
    """A tritonserver killed outright leaves its python backend's /dev/shm regions behind (a clean
    shutdown removes them): stopping it removes the regions its group was using, and only those."""
    from tritonkit.server import SHM_DIR, LocalTriton, shm_regions
    from tritonkit.spec import ServerSpec

    _crashing_model(tmp_path / "repo", crashes=0)
    server = LocalTriton(tmp_path / "repo", ServerSpec(), tmp_path / "state", http_port=0, grpc_port=0,
                         metrics_port=0, models=["crasher"])
    bystander = SHM_DIR / f"triton_python_backend_shm_region_bystander-{tmp_path.name}"
    bystander.write_bytes(b"another server's")
    try:
        with server:
            regions = shm_regions(server.proc.pid)
            assert regions and all((SHM_DIR / r).exists() for r in regions), regions
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait(10)
            assert all((SHM_DIR / r).exists() for r in regions)  # the kill left them
        assert not any((SHM_DIR / r).exists() for r in regions)
        assert bystander.exists()
    finally:
        bystander.unlink(missing_ok=True)


def test_a_load_that_never_finishes_is_an_error_naming_the_model(tmp_path):
    """A python-backend model whose reload never finishes initialising (its stub sleeps): the load
    is an error naming the model and the bound within that bound, not a hang; the server is
    stopped by its own pid after it."""
    from tritonkit.clients.errors import DeadlineExceededError
    from tritonkit.server import LocalTriton
    from tritonkit.spec import ServerSpec

    _crashing_model(tmp_path / "repo", crashes=0)
    model_py = tmp_path / "repo" / "crasher" / "1" / "model.py"
    model_py.write_text(model_py.read_text().replace(
        "    def initialize(self, args):\n",
        "    def initialize(self, args):\n"
        "        if (Path(__file__).parent / 'stuck').exists():\n"
        "            import time\n"
        "            time.sleep(3600)\n"))
    server = LocalTriton(tmp_path / "repo", ServerSpec(), tmp_path / "state", http_port=0, grpc_port=0,
                         metrics_port=0, models=["crasher"])
    with server:
        (model_py.parent / "stuck").write_text("")
        with Client(server.endpoints.grpc, key_headers=server.endpoints.key_headers) as c:
            t0 = time.monotonic()
            with pytest.raises(DeadlineExceededError, match=r"crasher did not finish loading within 3 s"):
                c.load("crasher", timeout_s=3)
            assert time.monotonic() - t0 < 60  # the bound, not the stub's hour
    assert not server.alive()
