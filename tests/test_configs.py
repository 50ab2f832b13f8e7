"""config.pbtxt generation: Triton's schema, exact round trips, no-op regeneration, atomic writes."""

from __future__ import annotations

import copy

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from tests.conftest import SERVED_SPEC, tritonkit, write_spec
from tritonkit.configs.generate import build_config, generate, parse, render, resolve
from tritonkit.configs.loader import load_spec
from tritonkit.files import LAST_GOOD_SUFFIX


def test_written_file_parses_back_to_the_same_message(workdir):
    spec_path = write_spec(workdir, SERVED_SPEC)
    generate(load_spec(spec_path, workdir / "repo"), workdir / "repo")
    spec = load_spec(spec_path)
    for m in spec.models:
        written = (workdir / "repo" / m.name / "config.pbtxt").read_text()
        assert parse(written) == build_config(resolve(spec, m))


def test_every_batching_field_is_in_the_file(workdir):
    spec_path = write_spec(workdir, SERVED_SPEC)
    generate(load_spec(spec_path, workdir / "repo"), workdir / "repo")
    cfg = parse((workdir / "repo/all_fields/config.pbtxt").read_text())
    db = cfg.dynamic_batching
    assert list(db.preferred_batch_size) == [2, 4]
    assert db.max_queue_delay_microseconds == 1500
    assert (db.priority_levels, db.default_priority_level) == (3, 2)
    assert db.default_queue_policy.default_timeout_microseconds == 100000
    assert db.default_queue_policy.allow_timeout_override and db.default_queue_policy.max_queue_size == 20
    assert db.priority_queue_policy[1].timeout_action == mc.ModelQueuePolicy.DELAY
    assert db.priority_queue_policy[3].max_queue_size == 5
    assert cfg.response_cache.enable and cfg.instance_group[0].count == 2
    assert cfg.backend == "python" and cfg.parameters["intra_op_threads"].string_value == "1"


@pytest.mark.parametrize("keep", [False, True])
def test_behind_the_gateway_a_model_keeps_priority_levels_and_no_queue_policy(workdir, keep):
    """With `server.gateway.enabled`, Envoy refuses the overload: Triton keeps the levels that put
    interactive first (two where the model has none) and drops the policies that would refuse
    before Envoy, slowly; `keep_queue_policies` writes them as the spec says."""
    data = copy.deepcopy(SERVED_SPEC)
    data["server"] = {**data.get("server", {}), "gateway": {"enabled": True, "keep_queue_policies": keep}}
    generate(load_spec(write_spec(workdir, data), workdir / "repo"), workdir / "repo")
    db = parse((workdir / "repo/all_fields/config.pbtxt").read_text()).dynamic_batching
    assert (db.priority_levels, db.default_priority_level) == (3, 2)
    assert db.HasField("default_queue_policy") == keep and (1 in db.priority_queue_policy) == keep
    assert list(db.preferred_batch_size) == [2, 4] and db.max_queue_delay_microseconds == 1500
    # a model with a policy and no levels gains two; one that answers in order keeps its one level
    plain = parse((workdir / "repo/tiny_queue/config.pbtxt").read_text()).dynamic_batching
    assert (plain.priority_levels, plain.default_priority_level) == ((0, 0) if keep else (2, 2))
    assert plain.HasField("default_queue_policy") == keep
    ordered = parse((workdir / "repo/ordered/config.pbtxt").read_text()).dynamic_batching
    assert (ordered.priority_levels, ordered.preserve_ordering) == (1, True)


def test_unchanged_spec_changes_no_byte(workdir):
    spec_path = write_spec(workdir, SERVED_SPEC)
    generate(load_spec(spec_path, workdir / "repo"), workdir / "repo")
    files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (workdir / "repo").rglob("*") if p.is_file()}
    res = tritonkit("configs", "--spec", str(spec_path), "--out", str(workdir / "repo"))
    assert res.returncode == 0 and "unchanged" in res.stdout and "updated" not in res.stdout
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (workdir / "repo").rglob("*") if p.is_file()}
    assert after == files


def test_changed_spec_keeps_the_previous_config_as_last_good(workdir):
    spec_path = write_spec(workdir, SERVED_SPEC)
    generate(load_spec(spec_path, workdir / "repo"), workdir / "repo")
    path = workdir / "repo/reloadable/config.pbtxt"
    old = path.read_text()
    data = copy.deepcopy(SERVED_SPEC)
    data["models"][4]["batching"]["max_queue_delay_us"] = 7000
    generate(load_spec(write_spec(workdir, data), workdir / "repo"), workdir / "repo")
    assert "max_queue_delay_microseconds: 7000" in path.read_text()
    assert path.with_name(path.name + LAST_GOOD_SUFFIX).read_text() == old
    assert not list((workdir / "repo").rglob("*.tmp"))  # no temp file left behind


def test_tensors_come_from_the_onnx_graph_when_omitted(workdir):
    spec_path = write_spec(workdir, {"models": [{"name": "t", "onnx": "onnx/two_input.onnx", "max_batch_size": 4}]})
    generate(load_spec(spec_path, workdir / "repo"), workdir / "repo")
    cfg = parse((workdir / "repo/t/config.pbtxt").read_text())
    assert [(i.name, mc.DataType.Name(i.data_type), list(i.dims)) for i in cfg.input] == \
        [("ids", "TYPE_INT64", [-1]), ("mask", "TYPE_INT64", [-1])]
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("out", [-1])]


@pytest.mark.parametrize("gpus, platform, kind", [(1, "tensorrt_plan", "KIND_GPU"),
                                                   (0, "onnxruntime_onnx", "KIND_CPU")])
def test_ngc_target_is_the_deploy_blocks_node(workdir, gpus, platform, kind):
    """The node decides `auto`: TensorRT (built there from the ONNX) with a GPU, ONNX Runtime on the
    CPU without one, on this GPU-less machine either way."""
    spec_path = write_spec(workdir, {"models": [{"name": "m", "onnx": "onnx/mlp.onnx"}], "deploy": {"gpus": gpus}})
    res = tritonkit("configs", "--spec", str(spec_path), "--out", str(workdir / "repo"), "--target", "ngc")
    assert res.returncode == 0, res.stderr
    assert "target: NGC 24.10 (Triton 2.51.0) on x86" in res.stdout
    cfg = parse((workdir / "repo/m/config.pbtxt").read_text())
    assert cfg.platform == platform and not cfg.backend
    assert mc.ModelInstanceGroup.Kind.Name(cfg.instance_group[0].kind) == kind
    assert (workdir / "repo/m/1/model.onnx").exists() and not (workdir / "repo/m/1/model.py").exists()


def test_render_is_stable():
    cfg = mc.ModelConfig(name="x", max_batch_size=2)
    assert render(cfg) == render(parse(render(cfg)))
