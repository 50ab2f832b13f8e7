"""`tritonkit probe` on the bundled server, and what `validate`/`configs` make of its cached answer."""

from __future__ import annotations

import pytest

from tests.conftest import tritonkit, write_spec
from tritonkit.loadtests.server_probe import traits_from

pytestmark = [pytest.mark.server, pytest.mark.measures]

QUEUED = {"priority_levels": 2, "default_priority": 2, "default_queue_policy": {"max_queue_size": 16}}


def _spec(workdir, instances: int, batching: dict) -> None:
    write_spec(workdir, {"models": [{"name": "m", "onnx": "onnx/mlp.onnx", "max_batch_size": 8,
                                     "instances": {"count": instances}, "batching": batching}],
                         "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0}})


def test_the_probe_finds_the_bundled_batcher_stalls_behind_a_bounded_queue(probed):
    """Triton 2.51 sleeps 500 ms when a full queue refuses the requests that would wake it, and
    when a lone client's next request comes before the instance waits again (server_traits.py)."""
    ev = probed["evidence"]
    assert ev["capacity_rps"] > 0 and ev["offered_rps"] == pytest.approx(2 * ev["capacity_rps"], rel=0.01)
    assert probed["stalls"], ev
    # the collapse is an order of magnitude, not a margin: a bounded queue on one instance serves
    # a small share of what the same model serves without one, or a lone request waits ~500 ms
    assert ev["probe_bounded_x1"]["share"] < 0.6 or ev["lone_client_max_ms"] >= 300, ev
    # the decision is the one rule's, from this evidence
    decided = traits_from(probed["version"], ev)
    assert (decided.stalls, decided.safe_instances) == (probed["stalls"], probed["safe_instances"])
    assert f"Triton {probed['version']}" in probed["stdout"]


def test_validate_and_configs_warn_about_a_config_that_stalls_there(workdir, probed):
    _spec(workdir, 1, QUEUED)
    for args in (("validate",), ("configs", "--out", "repo")):
        r = tritonkit(*args, "--spec", "deploy.yaml", cwd=workdir)
        assert r.returncode == 0, r.stderr  # legal: a warning, not an error
        warning = next(ln for ln in r.stdout.splitlines() if ln.startswith("warning:"))
        assert "deploy.yaml" in warning and "'m'" in warning and "instances.count 1" in warning
        assert "fix:" in warning and "500 ms" in warning
    # the same model without a queue policy or priority levels keeps the batcher's prefetch
    _spec(workdir, 1, {"max_queue_delay_us": 500})
    r = tritonkit("validate", "--spec", "deploy.yaml", cwd=workdir)
    assert r.returncode == 0 and "warning" not in r.stdout, r.stdout
    # with the instance count the probe found safe, if it found one, the warning goes
    if probed["safe_instances"]:
        _spec(workdir, probed["safe_instances"], QUEUED)
        r = tritonkit("validate", "--spec", "deploy.yaml", cwd=workdir)
        assert r.returncode == 0 and "warning" not in r.stdout, r.stdout


def test_an_unprobed_server_is_named_in_the_warning(workdir, tmp_path):
    _spec(workdir, 1, QUEUED)
    r = tritonkit("validate", "--spec", "deploy.yaml", cwd=workdir, env={"TRITONKIT_CACHE": str(tmp_path / "empty")})
    assert r.returncode == 0
    assert "never probed" in r.stdout and "tritonkit probe" in r.stdout
