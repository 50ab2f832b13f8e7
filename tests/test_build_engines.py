"""build_engines on the CPU: graph preparation checked with ONNX Runtime, profile planning, the
memory bound, the max-batch agreement with configs, input errors and no-op rebuilds. The TensorRT
path is covered by the gpu-marked tests at the end (skipped without a GPU and TensorRT)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests import models, real_models
from tests.conftest import tritonkit, write_spec
from tritonkit.build_engines import artifacts
from tritonkit.build_engines.gpu import Gpu, Target, target
from tritonkit.build_engines.plan import make_plan, weight_bytes
from tritonkit.configs.generate import generate, parse
from tritonkit.configs.loader import load_spec
from tritonkit.errors import InputError
from tritonkit.spec import parse_spec


def static_reshape(path: Path) -> Path:
    """Exported with batch fixed at 1 and two hard-coded Reshapes: [1, 15] and [1, -1, 5]."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 5)).astype(np.float32), "W"),
             numpy_helper.from_array(np.array([1, 15], dtype=np.int64), "flat"),
             numpy_helper.from_array(rng.standard_normal(15).astype(np.float32), "B"),
             numpy_helper.from_array(np.array([1, -1, 5], dtype=np.int64), "unflat")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Reshape", ["h", "flat"], ["f"], name="flatten"),
             helper.make_node("Add", ["f", "B"], ["a"]),
             helper.make_node("Reshape", ["a", "unflat"], ["u"], name="unflatten"),
             helper.make_node("Relu", ["u"], ["y"])]
    graph = helper.make_graph(nodes, "static", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 5])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(onnx.shape_inference.infer_shapes(model), path)  # exporters record the batch-1 shapes too
    return path


def batch_folding(path: Path) -> Path:
    """Batch fixed at 1 and a Reshape to [3, 4] that folds the batch axis away: not safely fixable."""
    shape = numpy_helper.from_array(np.array([3, 4], dtype=np.int64), "s")
    back = numpy_helper.from_array(np.array([1, 3, 4], dtype=np.int64), "b")
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"], name="fold_batch"),
             helper.make_node("Relu", ["r"], ["z"]),
             helper.make_node("Reshape", ["z", "b"], ["y"])]
    graph = helper.make_graph(nodes, "folding", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4])],
                              initializer=[shape, back])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def static_if(path: Path, pin: bool) -> Path:
    """Batch fixed at 1 and an If ('pick') whose branches each hold weights; with `pin`, each branch
    ends in a Reshape to [1, 5], a batch-1 shape inside the subgraph."""
    def branch(name: str, seed: int) -> onnx.GraphProto:
        w = numpy_helper.from_array(np.random.default_rng(seed).standard_normal((4, 5)).astype(np.float32), f"{name}_w")
        nodes = [helper.make_node("MatMul", ["x", f"{name}_w"], [f"{name}_h"])]
        inits = [w]
        if pin:
            inits.append(numpy_helper.from_array(np.array([1, 5], np.int64), f"{name}_s"))
            nodes.append(helper.make_node("Reshape", [f"{name}_h", f"{name}_s"], [f"{name}_out"]))
        else:
            nodes.append(helper.make_node("Relu", [f"{name}_h"], [f"{name}_out"]))
        out = helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [1, 5])
        return helper.make_graph(nodes, name, [], [out], initializer=inits)

    # A shape check the exporter left in (batch > 0): the same for every batch, and not a constant
    # once the batch axis is dynamic, so the If stays.
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
             helper.make_node("Greater", ["n", "zero"], ["pos"]),
             helper.make_node("If", ["pos"], ["y"], name="pick", then_branch=branch("a", 1),
                              else_branch=branch("b", 2))]
    graph = helper.make_graph(nodes, "static_if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
                              initializer=[numpy_helper.from_array(np.array(0, np.int64), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def run(path_or_model, feed):
    data = path_or_model.SerializeToString() if isinstance(path_or_model, onnx.ModelProto) else str(path_or_model)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return sess.run(None, feed)[0]


def files_state(folder: Path) -> dict:
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def assert_input_error(res, *words):
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    for w in words:
        assert w in res.stderr, res.stderr


# ---- graph preparation --------------------------------------------------------------------------

def test_static_batch_reshape_becomes_dynamic_and_matches_the_original(tmp_path):
    static_reshape(tmp_path / "static.onnx")
    spec = write_spec(tmp_path, {"models": [{"name": "st", "onnx": "static.onnx", "max_batch_size": 8,
                                             "batching": {"preferred_batch_sizes": [4]}}]})
    res = tritonkit("build", "--spec", str(spec), "--out", str(tmp_path / "repo"))
    assert res.returncode == 0, res.stderr
    assert "batch axis made dynamic" in res.stdout and "2 Reshape shape constant(s) patched" in res.stdout
    assert "engine build skipped" in res.stdout or not target().reason

    prepared = onnx.load(tmp_path / "repo/st/build/model.onnx")
    for vi in [*prepared.graph.input, *prepared.graph.output]:
        assert vi.type.tensor_type.shape.dim[0].dim_param  # symbolic, not 1
    # The version folder serves the prepared graph, and config.pbtxt says the batch it takes.
    assert (tmp_path / "repo/st/1/model.onnx").read_bytes() == (tmp_path / "repo/st/build/model.onnx").read_bytes()
    assert parse((tmp_path / "repo/st/config.pbtxt").read_text()).max_batch_size == 8

    rng = np.random.default_rng(7)
    x1 = rng.standard_normal((1, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(run(prepared, {"x": x1}), run(tmp_path / "static.onnx", {"x": x1}), atol=1e-6)
    x6 = rng.standard_normal((6, 3, 4)).astype(np.float32)
    stacked = np.concatenate([run(tmp_path / "static.onnx", {"x": x6[i:i + 1]}) for i in range(6)])
    got = run(prepared, {"x": x6})
    assert got.shape == (6, 3, 5)
    np.testing.assert_allclose(got, stacked, atol=1e-6)

    record = json.loads((tmp_path / "repo/st/build/build.json").read_text())
    checked = sorted(c["shapes"]["x"][0] for c in record["verify"]["checks"])
    assert checked == [1, 4, 8] and all(c["passed"] for c in record["verify"]["checks"])
    assert record["prepared"]["static_batch_made_dynamic"] is True


def test_a_reshape_that_folds_the_batch_axis_is_refused_with_the_reason(tmp_path):
    batch_folding(tmp_path / "fold.onnx")
    spec = write_spec(tmp_path, {"models": [{"name": "f", "onnx": "fold.onnx", "max_batch_size": 4}]})
    res = tritonkit("build", "--spec", str(spec), "--out", str(tmp_path / "repo"))
    assert_input_error(res, "models[0].max_batch_size", "cannot make the batch axis dynamic safely",
                       "'fold_batch'", "[3, 4]", "fix: re-export")
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("kind", ["corrupt", "truncated"])
def test_corrupt_or_truncated_onnx_is_a_clear_input_error(tmp_path, kind):
    good = models.mlp(tmp_path / "good.onnx", width=64, layers=2).read_bytes()
    bad = b"\x08\x07this is not a protobuf model" * 20 if kind == "corrupt" else good[: len(good) // 2]
    (tmp_path / "bad.onnx").write_bytes(bad)
    spec = write_spec(tmp_path, {"models": [{"name": "m", "onnx": "bad.onnx", "max_batch_size": 4}]})
    res = tritonkit("build", "--spec", str(spec), "--out", str(tmp_path / "repo"))
    assert_input_error(res, "deploy.yaml: models[0].onnx:", "bad.onnx is not a usable ONNX model", "(fix: ")
    assert not (tmp_path / "repo").exists()
    res = tritonkit("inspect", str(tmp_path / "bad.onnx"))
    assert_input_error(res, "is not a usable ONNX model")


def test_inspect_reports_io_dynamic_dims_and_op_counts(tmp_path):
    static_reshape(tmp_path / "static.onnx")
    models.two_input_int64(tmp_path / "two.onnx")
    res = tritonkit("inspect", str(tmp_path / "static.onnx"), str(tmp_path / "two.onnx"))
    assert res.returncode == 0, res.stderr
    assert "batch axis fixed at 1" in res.stdout and "Reshape 2" in res.stdout
    assert "input  ids: INT64 ['batch', 'seq']  dynamic dims [0, 1]" in res.stdout
    assert "Mul 1" in res.stdout


# ---- serving what was prepared ------------------------------------------------------------------

def test_after_build_a_batch_1_export_validates_and_generates_from_the_prepared_graph(tmp_path):
    static_reshape(tmp_path / "static.onnx")
    spec = write_spec(tmp_path, {"models": [{"name": "st", "onnx": "static.onnx", "max_batch_size": 8,
                                             "batching": {"preferred_batch_sizes": [4]}}]})
    repo = tmp_path / "repo"
    # Before the build the fixed batch is refused, with the way out.
    assert_input_error(tritonkit("validate", "--spec", str(spec), "--repo", str(repo)),
                       "models[0].max_batch_size", "fixed first dim 1", "run `tritonkit build` first")
    assert tritonkit("build", "--spec", str(spec), "--out", str(repo)).returncode == 0

    res = tritonkit("validate", "--spec", str(spec), "--repo", str(repo))
    assert res.returncode == 0 and "ok (1 model(s): st)" in res.stdout, res.stderr
    res = tritonkit("configs", "--spec", str(spec), "--out", str(repo))
    assert res.returncode == 0, res.stderr
    assert parse((repo / "st/config.pbtxt").read_text()).max_batch_size == 8
    # serve, loadtest and sweep load the spec through the same function before starting Triton.
    served = load_spec(spec, repo)
    assert served.onnx_path(served.models[0]) == (repo / "st/build/model.onnx").resolve()

    # A re-exported source is not what was prepared: refused again until it is rebuilt.
    model = onnx.load(tmp_path / "static.onnx")
    model.doc_string = "re-exported"
    onnx.save(model, tmp_path / "static.onnx")
    assert_input_error(tritonkit("validate", "--spec", str(spec), "--repo", str(repo)), "fixed first dim 1")


@pytest.mark.server
@pytest.mark.timeout(240)  # readline below blocks; a serve that hangs fails here, not at the suite's limit
def test_serve_after_build_answers_a_batch_the_export_could_not_take(tmp_path):
    static_reshape(tmp_path / "static.onnx")
    spec = write_spec(tmp_path, {"models": [{"name": "st", "onnx": "static.onnx", "max_batch_size": 8,
                                             "batching": {"preferred_batch_sizes": [4]}}],
                                 "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0}})
    repo, state = tmp_path / "repo", tmp_path / "state"
    assert tritonkit("build", "--spec", str(spec), "--out", str(repo)).returncode == 0
    exe = Path(sys.executable).parent / "tritonkit"
    proc = subprocess.Popen([str(exe), "serve", "--spec", str(spec), "--repo", str(repo), "--state-dir", str(state)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = ""
        while "Ctrl-C stops the server" not in seen:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                pytest.fail(f"serve exited {proc.returncode}:\n{seen}\n{proc.stderr.read()}")
            seen += line
        res = tritonkit("infer", "--model", "st", "--batch", "4", "--state-dir", str(state), timeout=60)
        assert res.returncode == 0, res.stderr
        assert "output y: [4, 3, 5] float32" in res.stdout  # the export took batch 1 only
    finally:
        proc.send_signal(signal.SIGTERM)  # serve stops its tritonserver on SIGTERM
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---- profile planning ---------------------------------------------------------------------------

TWO_INPUT = {"name": "t", "onnx": "two.onnx", "max_batch_size": 8,
             "batching": {"preferred_batch_sizes": [4]},
             "inputs": [{"name": "ids", "dims": [-1], "min": [1], "opt": [16], "max": [64]},
                        {"name": "mask", "dims": [-1], "min": [1], "opt": [16], "max": [64]}]}


def _plan(tmp_path, model: dict):
    spec = parse_spec(write_spec(tmp_path, {"models": [model]}))
    m = spec.models[0]
    return make_plan(spec, m, onnx.load(spec.onnx_path(m)))


def test_two_int64_inputs_with_a_dynamic_sequence_get_min_opt_max_profiles(tmp_path):
    models.two_input_int64(tmp_path / "two.onnx")
    plan = _plan(tmp_path, TWO_INPUT)
    assert plan.dtypes == {"ids": "INT64", "mask": "INT64"}
    (profile,) = plan.profiles
    for r in profile:
        assert (r.min, r.opt, r.max) == ((1, 1), (4, 16), (8, 64))

    buckets = _plan(tmp_path, {**TWO_INPUT, "build": {"bucket_edges": [16, 32]}})
    seq = [(r.min[1], r.opt[1], r.max[1]) for r in (p[0] for p in buckets.profiles)]
    assert seq == [(1, 16, 16), (17, 32, 32), (33, 64, 64)]
    assert all(p[0].max[1] == p[1].max[1] for p in buckets.profiles)  # ids and mask share the length

    # Through the command: the plan is recorded and ONNX Runtime ran every profile's shapes.
    spec = write_spec(tmp_path, {"models": [{**TWO_INPUT, "build": {"bucket_edges": [16, 32]}}]})
    res = tritonkit("build", "--spec", str(spec), "--out", str(tmp_path / "repo"))
    assert res.returncode == 0, res.stderr
    record = json.loads((tmp_path / "repo/t/build/build.json").read_text())
    assert record["plan"]["profiles"][1]["ids"] == {"min": [1, 17], "opt": [4, 32], "max": [8, 32]}
    assert len(record["verify"]["checks"]) == 9


def test_a_dynamic_dim_without_a_range_is_an_input_error(tmp_path):
    models.two_input_int64(tmp_path / "two.onnx")
    with pytest.raises(InputError) as e:
        _plan(tmp_path, {"name": "t", "onnx": "two.onnx", "max_batch_size": 8})
    assert any(p.path == "models[0].inputs" and "'ids' dim 0 is dynamic" in p.message for p in e.value.problems)
    with pytest.raises(InputError) as e:
        _plan(tmp_path, {**TWO_INPUT, "build": {"bucket_edges": [100]}})
    assert e.value.problems[0].path == "models[0].build.bucket_edges[0]"


def test_a_smaller_memory_budget_lowers_the_max_batch(tmp_path):
    models.mlp(tmp_path / "mlp.onnx", width=256, layers=2)  # 0.5 MiB of weights, 1 KiB per sample per tensor
    base = {"name": "m", "onnx": "mlp.onnx", "max_batch_size": 512}
    plans = {mb: _plan(tmp_path, {**base, "memory_budget_mb": mb}) for mb in (64, 1, 0.75)}
    assert plans[64].max_batch == 512 and plans[64].bounded_by == "spec"
    assert 1 <= plans[0.75].max_batch < plans[1].max_batch < 512
    assert plans[1].bounded_by == "memory"
    for p in (plans[1], plans[0.75]):  # the bound is the largest batch that fits, not a guess
        assert p.memory.total_bytes <= p.memory.budget_bytes
    # Two instances hold two copies of everything: twice the budget buys the same batch.
    two = _plan(tmp_path, {**base, "memory_budget_mb": 1.5, "instances": {"count": 2}})
    assert two.max_batch == plans[0.75].max_batch
    with pytest.raises(InputError) as e:
        _plan(tmp_path, {**base, "memory_budget_mb": 0.25})
    assert e.value.problems[0].path == "models[0].memory_budget_mb" and "too small" in e.value.problems[0].message


@pytest.mark.parametrize("budget", [None, 64, 1, 0.75])
def test_planned_max_batch_and_generated_max_batch_size_agree(tmp_path, budget):
    models.mlp(tmp_path / "mlp.onnx", width=256, layers=2)
    model = {"name": "m", "onnx": "mlp.onnx", "max_batch_size": 512, "memory_budget_mb": budget}
    spec_path = write_spec(tmp_path, {"models": [model]})
    plan = _plan(tmp_path, model)
    # configs alone (no build) and build (which writes configs) apply the same rule.
    generate(load_spec(spec_path, tmp_path / "plain"), tmp_path / "plain")
    assert parse((tmp_path / "plain/m/config.pbtxt").read_text()).max_batch_size == plan.max_batch
    res = tritonkit("build", "--spec", str(spec_path), "--out", str(tmp_path / "repo"))
    assert res.returncode == 0, res.stderr
    cfg = parse((tmp_path / "repo/m/config.pbtxt").read_text())
    record = json.loads((tmp_path / "repo/m/build/build.json").read_text())
    assert cfg.max_batch_size == record["plan"]["max_batch"] == plan.max_batch
    assert max(w.batch_size for w in cfg.model_warmup) == plan.max_batch


def test_configs_refuses_preferred_sizes_above_the_memory_bound(tmp_path):
    models.mlp(tmp_path / "mlp.onnx", width=256, layers=2)
    spec = write_spec(tmp_path, {"models": [{"name": "m", "onnx": "mlp.onnx", "max_batch_size": 512,
                                             "memory_budget_mb": 1, "batching": {"preferred_batch_sizes": [512]}}]})
    res = tritonkit("configs", "--spec", str(spec), "--out", str(tmp_path / "repo"))
    assert_input_error(res, "models[0].memory_budget_mb: bounds the max batch to", "preferred_batch_sizes [512]")
    assert not (tmp_path / "repo").exists()


# ---- real exports -------------------------------------------------------------------------------

AUDIO_INPUTS = [{"name": "input", "dims": [-1, -1], "min": [1, 160], "opt": [2, 512], "max": [4, 1024]},
                {"name": "state", "dims": [2, -1, 128], "min": [2, 1, 128], "opt": [2, 2, 128], "max": [2, 4, 128]},
                {"name": "sr", "dims": []}]
TEXT_INPUTS = [{"name": n, "dims": [-1], "min": [1], "opt": [16], "max": [64]} for n in ("input_ids", "attention_mask")]


def fixed_batch(source: Path, path: Path, batch: int) -> Path:
    """`source` with its batch axis pinned to `batch` on every input and output (a fixed-batch export)."""
    model = onnx.load(source)
    for vi in [*model.graph.input, *model.graph.output]:
        dim = vi.type.tensor_type.shape.dim[0]
        dim.Clear()
        dim.dim_value = batch
    onnx.save(model, path)
    return path


def test_a_minus_one_batch_axis_is_dynamic_and_builds_for_batch_16(tmp_path):
    real_models.minus_one_classifier(tmp_path / "cls.onnx")
    spec = write_spec(tmp_path, {"models": [{"name": "cls", "onnx": "cls.onnx", "max_batch_size": 16}]})
    res = tritonkit("build", "--spec", str(spec), "--out", str(tmp_path / "repo"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert parse((tmp_path / "repo/cls/config.pbtxt").read_text()).max_batch_size == 16
    record = json.loads((tmp_path / "repo/cls/build/build.json").read_text())
    assert record["prepared"]["static_batch_made_dynamic"] is False  # nothing to make dynamic: it already is
    assert sorted(c["shapes"]["x"][0] for c in record["verify"]["checks"]) == [1, 16]
    assert all(c["passed"] for c in record["verify"]["checks"])

    prepared = onnx.load(tmp_path / "repo/cls/build/model.onnx")
    x = np.random.default_rng(3).standard_normal((16, 16)).astype(np.float32)
    got = run(prepared, {"x": x})
    assert got.shape == (16, 4)
    np.testing.assert_allclose(got, run(tmp_path / "cls.onnx", {"x": x}), atol=1e-6)


def test_a_stateful_model_with_if_subgraphs_builds_unchanged_for_both_sample_rates(tmp_path):
    real_models.stateful_audio(tmp_path / "vad.onnx")
    spec = write_spec(tmp_path, {"models": [{"name": "vad", "onnx": "vad.onnx", "max_batch_size": 0,
                                             "inputs": AUDIO_INPUTS}]})
    res = tritonkit("build", "--spec", str(spec), "--out", str(tmp_path / "repo"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "subgraphs: graph left as exported" in res.stdout
    original = onnx.load(tmp_path / "vad.onnx")
    prepared = onnx.load(tmp_path / "repo/vad/build/model.onnx")
    assert prepared.graph.SerializeToString() == original.graph.SerializeToString()
    record = json.loads((tmp_path / "repo/vad/build/build.json").read_text())
    assert record["verify"]["checks"] and all(c["passed"] for c in record["verify"]["checks"])

    rng = np.random.default_rng(4)
    feed = {"input": rng.standard_normal((3, 512)).astype(np.float32),
            "state": rng.standard_normal((2, 3, 128)).astype(np.float32)}
    ref = ort.InferenceSession(str(tmp_path / "vad.onnx"), providers=["CPUExecutionProvider"])
    new = ort.InferenceSession(prepared.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = {}
    for sr in (16000, 8000):
        f = {**feed, "sr": np.array(sr, dtype=np.int64)}
        want, got = ref.run(None, f), new.run(None, f)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)
        outs[sr] = got[0]
    assert not np.allclose(outs[16000], outs[8000])  # each rate ran its own branch's weights


def test_a_stride_bound_detector_with_a_minus_one_batch_builds_and_verifies(tmp_path):
    real_models.stride_detector(tmp_path / "det.onnx")
    images = {"name": "images", "dims": [3, -1, -1], "min": [3, 32, 32], "opt": [3, 64, 64], "max": [3, 128, 128],
              "stride": 32}
    spec = write_spec(tmp_path, {"models": [{"name": "det", "onnx": "det.onnx", "max_batch_size": 4,
                                             "inputs": [images]}]})
    res = tritonkit("build", "--spec", str(spec), "--out", str(tmp_path / "repo"))
    assert res.returncode == 0, res.stdout + res.stderr
    record = json.loads((tmp_path / "repo/det/build/build.json").read_text())
    checks = record["verify"]["checks"]
    assert [c["shapes"]["images"] for c in checks] == [[1, 3, 32, 32], [4, 3, 64, 64], [4, 3, 128, 128]]
    assert all(c["passed"] for c in checks)
    assert parse((tmp_path / "repo/det/config.pbtxt").read_text()).max_batch_size == 4


def test_stride_rounds_every_planned_dynamic_dim_up_to_a_multiple(tmp_path):
    real_models.stride_detector(tmp_path / "det.onnx")
    images = {"name": "images", "dims": [3, -1, -1], "min": [3, 32, 32], "opt": [3, 64, 64], "max": [3, 128, 128]}
    model = {"name": "det", "onnx": "det.onnx", "max_batch_size": 4, "build": {"bucket_edges": [80]}}
    plan = _plan(tmp_path, {**model, "inputs": [{**images, "stride": 32}]})
    hw = [[(getattr(r, p)[2], getattr(r, p)[3]) for p in ("min", "opt", "max")] for (r,) in plan.profiles]
    assert hw == [[(32, 32), (64, 64), (96, 96)], [(96, 96), (128, 128), (128, 128)]]  # 80 -> 96, 81 -> 96
    plain = _plan(tmp_path, {**model, "inputs": [images]})
    assert plain.profiles[1][0].min[2] == 81  # without a stride the edges are taken as given
    # ... and ONNX Runtime refuses that shape, so the build says which field to set.
    spec = write_spec(tmp_path, {"models": [{**model, "inputs": [images]}]})
    res = tritonkit("build", "--spec", str(spec), "--out", str(tmp_path / "repo"))
    assert_input_error(res, "models[0].inputs", "fails at images [4, 3, 80, 80]", "set stride: on the input")


def test_a_batch_1_export_with_subgraphs_is_made_dynamic_or_refused_naming_the_node(tmp_path):
    static_if(tmp_path / "free.onnx", pin=False)
    static_if(tmp_path / "pinned.onnx", pin=True)
    spec = write_spec(tmp_path, {"models": [{"name": "free", "onnx": "free.onnx", "max_batch_size": 4}]})
    res = tritonkit("build", "--spec", str(spec), "--out", str(tmp_path / "repo"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "batch axis made dynamic" in res.stdout and "subgraphs folded and sorted too" in res.stdout
    prepared = onnx.load(tmp_path / "repo/free/build/model.onnx")
    assert [n.op_type for n in prepared.graph.node].count("If") == 1
    x = np.random.default_rng(5).standard_normal((4, 4)).astype(np.float32)
    stacked = np.concatenate([run(tmp_path / "free.onnx", {"x": x[i:i + 1]}) for i in range(4)])
    np.testing.assert_allclose(run(prepared, {"x": x}), stacked, atol=1e-6)

    spec = write_spec(tmp_path, {"models": [{"name": "pinned", "onnx": "pinned.onnx", "max_batch_size": 4}]})
    res = tritonkit("build", "--spec", str(spec), "--out", str(tmp_path / "repo2"))
    assert_input_error(res, "models[0].max_batch_size", "cannot make the batch axis dynamic safely",
                       "If 'pick'", "fix: re-export")
    assert not (tmp_path / "repo2").exists()


@pytest.mark.parametrize("kind", ["fixed_batch_2", "corrupt"])
def test_a_model_that_cannot_be_prepared_fails_alone_and_the_others_get_configs(tmp_path, kind):
    real_models.minus_one_classifier(tmp_path / "cls.onnx")
    real_models.text_classifier(tmp_path / "text.onnx")
    if kind == "corrupt":
        (tmp_path / "bad.onnx").write_bytes(b"\x08\x07this is not a protobuf model" * 20)
        words = ["models[1].onnx", "model 'bad'", "is not a usable ONNX model", "fix: point onnx:"]
    else:
        fixed_batch(tmp_path / "cls.onnx", tmp_path / "bad.onnx", 2)
        words = ["models[1].max_batch_size", "model 'bad'", "leading dims are x: 2", "fix: re-export"]
    spec = write_spec(tmp_path, {"models": [
        {"name": "cls", "onnx": "cls.onnx", "max_batch_size": 16},
        {"name": "bad", "onnx": "bad.onnx", "max_batch_size": 8},
        {"name": "text", "onnx": "text.onnx", "max_batch_size": 8, "inputs": TEXT_INPUTS}]})
    repo = tmp_path / "repo"
    res = tritonkit("build", "--spec", str(spec), "--out", str(repo))
    assert_input_error(res, *words)
    assert len([ln for ln in res.stderr.splitlines() if ln.startswith("tritonkit: error:")]) == 1
    rows = {ln.split()[0]: ln.split()[1] for ln in res.stdout.splitlines() if ln.split()[:1] in (["cls"], ["bad"],
                                                                                                    ["text"])}
    assert rows["bad"] == "failed" and {rows["cls"], rows["text"]} <= {"prepared", "built"}, res.stdout
    assert "problem" in res.stdout and "[2/3] bad: failed: models[1]." in res.stdout
    for name in ("cls", "text"):
        assert parse((repo / name / "config.pbtxt").read_text()).max_batch_size in (16, 8)
        assert (repo / name / "build/build.json").is_file()
    assert not (repo / "bad").exists()


def test_inspect_counts_the_weights_inside_if_branches(tmp_path):
    real_models.stateful_audio(tmp_path / "vad.onnx")
    hidden = 128
    assert weight_bytes(onnx.load(tmp_path / "vad.onnx")) == (2 * hidden + hidden) * 4 + 8  # branches, readout, sr
    res = tritonkit("inspect", str(tmp_path / "vad.onnx"))
    assert res.returncode == 0, res.stderr
    assert "weights 1.5 KiB" in res.stdout, res.stdout
    assert "input  sr: INT64 []" in res.stdout and "batch axis none (rank-0 'sr'" in res.stdout


# ---- rebuilds -----------------------------------------------------------------------------------

def test_an_unchanged_spec_does_not_rebuild(tmp_path):
    static_reshape(tmp_path / "static.onnx")
    model = {"name": "st", "onnx": "static.onnx", "max_batch_size": 8}
    spec = write_spec(tmp_path, {"models": [model]})
    repo = tmp_path / "repo"
    assert tritonkit("build", "--spec", str(spec), "--out", str(repo)).returncode == 0
    before = files_state(repo)
    res = tritonkit("build", "--spec", str(spec), "--out", str(repo))
    assert res.returncode == 0, res.stderr
    assert "unchanged" in res.stdout and "prepare" not in res.stdout
    assert files_state(repo) == before  # same bytes, same mtimes

    write_spec(tmp_path, {"models": [{**model, "build": {"atol": 1e-5}}]})
    res = tritonkit("build", "--spec", str(spec), "--out", str(repo))
    assert res.returncode == 0 and "prepare static.onnx" in res.stdout  # a changed setting rebuilds


# ---- engines ------------------------------------------------------------------------------------

def test_an_engine_for_another_gpu_or_tensorrt_is_refused():
    engine = {"trt_version": "10.3.0", "gpu_name": "Orin", "compute_capability": "8.7", "hardware_compat": "none"}
    orin = Gpu("Orin", "8.7")
    assert artifacts.engine_mismatch(engine, Target(orin, "10.3.0", None)) is None
    why = artifacts.engine_mismatch(engine, Target(orin, "11.0.0", None))
    assert "built with TensorRT 10.3.0, this machine has 11.0.0" in why
    why = artifacts.engine_mismatch(engine, Target(Gpu("NVIDIA L4", "8.9"), "10.3.0", None))
    assert "built for Orin (compute capability 8.7" in why and "NVIDIA L4 (8.9)" in why
    # Ampere-plus engines run on any Ampere or newer GPU, not on Turing.
    amp = {**engine, "hardware_compat": "ampere_plus"}
    assert artifacts.engine_mismatch(amp, Target(Gpu("NVIDIA L4", "8.9"), "10.3.0", None)) is None
    assert artifacts.engine_mismatch(amp, Target(Gpu("Tesla T4", "7.5"), "10.3.0", None))


def test_without_a_gpu_the_engine_step_says_why_in_one_line(tmp_path):
    here = target()
    if here.reason is None:
        pytest.skip("this machine can build engines")
    models.mlp(tmp_path / "mlp.onnx", width=64, layers=2)
    spec = write_spec(tmp_path, {"models": [{"name": "m", "onnx": "mlp.onnx", "max_batch_size": 4}]})
    res = tritonkit("build", "--spec", str(spec), "--out", str(tmp_path / "repo"))
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if "engine build skipped" in ln]
    assert len(lines) == 1 and here.reason in lines[0]
    cfg = parse((tmp_path / "repo/m/config.pbtxt").read_text())
    assert cfg.backend == "python" and not (tmp_path / "repo/m/1/model.plan").exists()


needs_gpu = pytest.mark.skipif(target().reason is not None, reason=f"TensorRT path: {target().reason}")


@pytest.mark.gpu
@needs_gpu
def test_engine_build_records_the_target_and_matches_onnxruntime(tmp_path):
    models.mlp(tmp_path / "mlp.onnx", width=256, layers=2)
    spec = write_spec(tmp_path, {"models": [{"name": "m", "onnx": "mlp.onnx", "max_batch_size": 16,
                                             "runtime": "tensorrt", "batching": {"preferred_batch_sizes": [4]}}]})
    repo, cache = tmp_path / "repo", tmp_path / "cache"
    res = tritonkit("build", "--spec", str(spec), "--out", str(repo), "--cache-dir", str(cache))
    assert res.returncode == 0, res.stdout + res.stderr
    record = json.loads((repo / "m/build/build.json").read_text())
    here = target()
    engine = record["engine"]
    assert engine["trt_version"] == here.trt_version and engine["compute_capability"] == here.gpu.compute_capability
    assert engine["max_abs"] < 1e-2 and engine["profiles"] == 1  # the build fails outside atol/rtol anyway
    assert (repo / "m/1/model.plan").is_file() and list(cache.glob("timing-*.cache"))
    cfg = parse((repo / "m/config.pbtxt").read_text())
    assert cfg.platform == "tensorrt_plan" and cfg.max_batch_size == record["plan"]["max_batch"]
    before = files_state(repo)
    res = tritonkit("build", "--spec", str(spec), "--out", str(repo), "--cache-dir", str(cache))
    assert "unchanged" in res.stdout and files_state(repo) == before


@pytest.mark.gpu
@needs_gpu
def test_engine_with_length_buckets_maps_every_profile_to_the_instances(tmp_path):
    models.seq_mean(tmp_path / "seq.onnx")
    spec = write_spec(tmp_path, {"models": [{
        "name": "s", "onnx": "seq.onnx", "max_batch_size": 8, "runtime": "tensorrt",
        "inputs": [{"name": "x", "dims": [-1], "min": [1], "opt": [32], "max": [128]}],
        "build": {"bucket_edges": [32]}}]})
    res = tritonkit("build", "--spec", str(spec), "--out", str(tmp_path / "repo"),
                    "--cache-dir", str(tmp_path / "cache"))
    assert res.returncode == 0, res.stdout + res.stderr
    cfg = parse((tmp_path / "repo/s/config.pbtxt").read_text())
    assert list(cfg.instance_group[0].profile) == ["0", "1"]


def _rate_gated(path: Path) -> Path:
    """x [N, 4] and a scalar sample rate: at 16000 the If doubles x; any other rate reshapes it to
    rows of 3, which no planned shape can take. A spec that says `value: 16000` never sends those."""
    def branch(name: str, nodes, extra=()) -> onnx.GraphProto:
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT,
                                                                                   ["rows", "cols"])],
                                 initializer=list(extra))

    then = branch("at16k", [helper.make_node("Add", ["x", "x"], ["at16k_y"])])
    other = branch("other", [helper.make_node("Reshape", ["x", "rows3"], ["other_y"])],
                   [numpy_helper.from_array(np.array([-1, 3], np.int64), "rows3")])
    graph = helper.make_graph(
        [helper.make_node("Equal", ["sr", "sr16k"], ["is16k"]),
         helper.make_node("If", ["is16k"], ["y"], then_branch=then, else_branch=other)],
        "rate_gated",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", "cols"])],
        initializer=[numpy_helper.from_array(np.array(16000, np.int64), "sr16k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_build_verifies_with_the_values_the_spec_gives(tmp_path):
    """Build's verification draws inputs by the same rules as every request: with `value: 16000`
    it runs the branch production runs and verifies; without it, the other branch fails there."""
    _rate_gated(tmp_path / "gated.onnx")
    inputs = [{"name": "x", "dims": [-1, 4], "min": [1, 4], "opt": [2, 4], "max": [5, 4]},
              {"name": "sr", "dims": [], "value": 16000}]
    spec = write_spec(tmp_path, {"models": [{"name": "gated", "onnx": "gated.onnx", "max_batch_size": 0,
                                             "inputs": inputs}]})
    res = tritonkit("build", "--spec", str(spec), "--out", str(tmp_path / "repo"))
    assert res.returncode == 0, res.stdout + res.stderr
    record = json.loads((tmp_path / "repo/gated/build/build.json").read_text())
    assert record["verify"]["checks"] and all(c["passed"] for c in record["verify"]["checks"])

    inputs[1].pop("value")
    spec = write_spec(tmp_path, {"models": [{"name": "gated", "onnx": "gated.onnx", "max_batch_size": 0,
                                             "inputs": inputs}]})
    res = tritonkit("build", "--spec", str(spec), "--out", str(tmp_path / "repo2"))
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stdout + res.stderr
