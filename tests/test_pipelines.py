"""Pipelines as Triton ensembles: every check before anything is written (one bad spec per
check, through the real command: exit 2, the field path and a fix, nothing on disk), and a
three-step pipeline with a fan-out served by the real server, whose answers equal the chain run
step by step in ONNX Runtime."""

from __future__ import annotations

import copy

import numpy as np
import onnxruntime as ort
import pytest

from tests import pipeline_models as pm
from tests.conftest import tritonkit, write_spec


@pytest.fixture(scope="module")
def pipeline_onnx(tmp_path_factory):
    d = tmp_path_factory.mktemp("pipeline_onnx")
    pm.write_all(d)
    return d


def _step(spec: dict, i: int) -> dict:
    return spec["pipelines"][0]["steps"][i]


def _extra(pipeline_onnx, name: str, onnx_name: str | None = None, **kw) -> dict:
    return {"name": name, "onnx": str(pipeline_onnx / f"{onnx_name or name}.onnx"), "max_batch_size": 8,
            "warmup": False, **kw}


BAD = {
    # each step's model is in the spec
    "unknown model": (lambda s, d: _step(s, 1).update(model="box_headz"),
                      "pipelines[0].steps[1].model", "no model named 'box_headz'"),
    # every mapped name exists on both sides
    "no such model input": (lambda s, d: _step(s, 1).update(inputs={"feats": "feat"}),
                            "pipelines[0].steps[1].inputs.feats", "box_head has no input 'feats'"),
    "no such model output": (lambda s, d: _step(s, 2).update(outputs={"probs": "scores"}),
                             "pipelines[0].steps[2].outputs.probs", "class_head has no output 'probs'"),
    "nothing writes it": (lambda s, d: _step(s, 1).update(inputs={"feat": "featz"}),
                          "pipelines[0].steps[1].inputs.feat", "no step writes pipeline tensor 'featz'"),
    "written twice": (lambda s, d: _step(s, 2).update(outputs={"scores": "boxes"}),
                      "pipelines[0].steps[2].outputs.scores", "is already written by steps[1]"),
    "written, never read": (lambda s, d: s["pipelines"][0].update(outputs=["boxes"]),
                            "pipelines[0].steps[2].outputs.scores", "is written but nothing reads it"),
    # dtypes agree
    "dtype": (lambda s, d: (s["models"].append(_extra(d, "int_head")),
                            _step(s, 1).update(model="int_head", inputs={"ids": "feat"}, outputs={"out": "boxes"})),
              "pipelines[0].steps[1].inputs.ids", "'feat' is FP32 from steps[0] (backbone output features), but "
                                                  "int_head input ids takes INT64"),
    # dims compatible
    "dims": (lambda s, d: (s["models"].append(_extra(d, "narrow_head")),
                           _step(s, 1).update(model="narrow_head")),
             "pipelines[0].steps[1].inputs.feat", "has dims [64] from steps[0] (backbone output features), but "
                                                  "narrow_head input feat takes [32]"),
    # batch axes agree
    "batch axes": (lambda s, d: s["models"][1].update(max_batch_size=0, batching={"enabled": False}),
                   "pipelines[0].steps[1].model", "box_head has no batch axis"),
    # the pipeline's inputs and outputs are all used
    "unused input": (lambda s, d: s["pipelines"][0].update(inputs=["image", "depth"]),
                     "pipelines[0].inputs[1]", "no step reads pipeline input 'depth'"),
    "output never written": (lambda s, d: s["pipelines"][0].update(outputs=["boxes", "scores", "masks"]),
                             "pipelines[0].outputs[2]", "no step writes pipeline output 'masks'"),
    "unmapped model input": (lambda s, d: (s["models"].append(_extra(d, "ids_and_mask")),
                                           s["pipelines"][0].update(inputs=["image", "ids"],
                                                                    outputs=["boxes", "scores", "tokens"]),
                                           s["pipelines"][0]["steps"].append({"model": "ids_and_mask",
                                                                              "inputs": {"ids": "ids"},
                                                                              "outputs": {"out": "tokens"}})),
                             "pipelines[0].steps[3].inputs", "ids_and_mask's input 'mask' is not mapped"),
    "a step that maps nothing": (lambda s, d: _step(s, 0).update(inputs={}),
                                 "pipelines[0].steps[0].inputs", "should have at least 1 item"),
    # no cycles
    "cycle": (lambda s, d: (s["models"].extend([_extra(d, "relay_a", "relay"), _extra(d, "relay_b", "relay")]),
                            s["pipelines"][0]["steps"].extend([
                                {"model": "relay_a", "inputs": {"x": "loop_b"}, "outputs": {"y": "loop_a"}},
                                {"model": "relay_b", "inputs": {"x": "loop_a"}, "outputs": {"y": "loop_b"}}])),
              "pipelines[0].steps", "the steps form a cycle: steps[3] (relay_a) -> steps[4] (relay_b) -> steps[3]"),
    # a name of its own
    "name clash": (lambda s, d: s["pipelines"][0].update(name="backbone"),
                   "pipelines[0].name", "'backbone' is already the name of a model"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_pipeline_is_refused_before_anything_is_written(case, tmp_path, pipeline_onnx):
    change, field, message = BAD[case]
    spec = pm.camera_spec(pipeline_onnx)
    change(spec, pipeline_onnx)
    path = write_spec(tmp_path, spec)
    repo = tmp_path / "repo"
    r = tritonkit("configs", "--spec", str(path), "--out", str(repo))
    assert r.returncode == 2, r.stdout + r.stderr
    assert field in r.stderr and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not repo.exists()  # nothing written, not even the models that were fine


def test_a_good_pipeline_generates_its_ensemble_through_the_schema(tmp_path, pipeline_onnx):
    from tritonkit.configs.generate import generate, parse
    from tritonkit.configs.loader import load_spec

    path = write_spec(tmp_path, pm.camera_spec(pipeline_onnx))
    reports = generate(load_spec(path), tmp_path / "repo")
    assert [r.model for r in reports] == ["backbone", "box_head", "class_head", "camera"]
    cfg = parse((tmp_path / "repo" / "camera" / "config.pbtxt").read_text())
    assert cfg.platform == "ensemble" and cfg.max_batch_size == 8
    assert [(i.name, list(i.dims)) for i in cfg.input] == [("image", [32])]
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("boxes", [4]), ("scores", [10])]
    steps = cfg.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["backbone", "box_head", "class_head"]
    assert dict(steps[0].output_map) == {"features": "feat"} and dict(steps[2].input_map) == {"feat": "feat"}
    assert (tmp_path / "repo" / "camera" / "1").is_dir()


def _chain(pipeline_onnx, x: np.ndarray) -> dict[str, np.ndarray]:
    def run(name: str, feed: dict) -> list[np.ndarray]:
        return ort.InferenceSession(str(pipeline_onnx / f"{name}.onnx"), providers=["CPUExecutionProvider"]).run(
            None, feed)

    (feat,) = run("backbone", {"pixels": x})
    return {"boxes": run("box_head", {"feat": feat})[0], "scores": run("class_head", {"feat": feat})[0]}


def test_the_pipeline_serves_what_the_chain_computes_step_by_step(tmp_path, pipeline_onnx):
    from tritonkit.configs.generate import generate
    from tritonkit.configs.loader import load_spec
    from tritonkit.serving import running

    path = write_spec(tmp_path, pm.camera_spec(pipeline_onnx))
    spec = load_spec(path)
    generate(spec, tmp_path / "repo")
    rng = np.random.default_rng(0)
    with running(spec, tmp_path / "repo", tmp_path / "state") as r, r.client() as c:
        assert c.model_ready("camera")
        for batch in (1, 4):
            x = rng.standard_normal((batch, 32)).astype(np.float32)
            got = c.infer("camera", {"image": x})
            want = _chain(pipeline_onnx, x)
            assert set(got) == {"boxes", "scores"}
            for name in want:
                assert got[name].shape == want[name].shape
                np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


def test_pipelines_in_the_spec_need_no_pipelines_key(tmp_path, pipeline_onnx):
    """A spec without `pipelines:` is as before: the key is optional and defaults to none."""
    from tritonkit.configs.loader import load_spec

    spec = copy.deepcopy(pm.camera_spec(pipeline_onnx))
    del spec["pipelines"]
    assert load_spec(write_spec(tmp_path, spec)).pipelines == []


def test_deploy_ships_the_pipeline(tmp_path, pipeline_onnx):
    """`tritonkit deploy --dry-run`: the ensemble's config goes into the ConfigMap beside its models',
    the server loads it after them, and no tuner sidecar watches it (it has no batching of its own)."""
    import yaml

    from tests.test_helm import container, one, policy_problems, schema_problems

    spec = pm.camera_spec(pipeline_onnx)
    spec["server"] = {}
    spec["deploy"] = {"tuner": True, "kit_image": "registry.local:5000/tritonkit:0.2"}
    write_spec(tmp_path, spec)
    p = tritonkit("deploy", "--dry-run", "--out", "o", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    docs = [d for d in yaml.safe_load_all((tmp_path / "o" / "manifests.yaml").read_text()) if d]
    assert schema_problems(docs) == [] and policy_problems(docs) == []
    cm = one(docs, "ConfigMap", "triton-edge-model-configs")  # beside the node build's ConfigMap
    assert 'platform: "ensemble"' in cm["data"]["camera.config.pbtxt"]
    t = one(docs, "Deployment")
    args = container(t, "triton")["args"]
    loads = [a.split("=", 1)[1] for a in args if a.startswith("--load-model=")]
    assert loads == ["backbone", "box_head", "class_head", "camera"]
    tuners = {c["name"] for c in t["spec"]["template"]["spec"]["containers"] if c["name"].startswith("tuner-")}
    assert tuners == {"tuner-backbone", "tuner-box-head", "tuner-class-head"}


@pytest.mark.parametrize("engine", ["asyncio", "perf_analyzer", "locust"])
def test_a_pipeline_load_test_breaks_its_latency_down_per_step(engine, tmp_path, pipeline_onnx):
    """`loadtest --model <pipeline>`: end-to-end percentiles, and each step's requests, queue and
    compute from Triton's statistics; the fan-out's two heads each run every request once."""
    import json

    path = write_spec(tmp_path, pm.camera_spec(pipeline_onnx))
    r = tritonkit("loadtest", "--spec", str(path), "--model", "camera", "--engine", engine, "--rps", "100",
                  "--duration", "3", "--warmup", "1", "--repo", str(tmp_path / "repo"), "--state-dir",
                  str(tmp_path / "state"), "--out", str(tmp_path / "out"), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "per step" in r.stdout and "class_head" in r.stdout
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    ok = result["overall"]["ok"]
    assert ok >= 200 and result["overall"]["p95_ms"] > 0
    steps = {s["model"]: s for s in result["steps"]}
    assert list(steps) == ["backbone", "box_head", "class_head"]
    for s in steps.values():
        # every request of the run passed each step once (the steady window's and the warm-up's)
        assert s["requests"] >= ok and s["failed"] == 0
        assert s["compute_ms"] > 0 and s["queue_ms"] >= 0 and s["mean_batch"] >= 1
    assert steps["box_head"]["requests"] == steps["class_head"]["requests"] == steps["backbone"]["requests"]


@pytest.mark.measures
def test_tune_mix_tunes_a_pipeline_and_a_model_together(tmp_path, pipeline_onnx):
    """`tune --mix`: the spec's traffic (a pipeline and a model, each with its SLO) sent together;
    the scale it holds is confirmed with every entry's requests pooled, and every model's config
    goes into tuned.yaml. (A 3 s confirmation here, where the command's lasts 30 s.)"""
    import json
    from dataclasses import replace

    import yaml

    from tritonkit.configs.loader import load_spec
    from tritonkit.tuner.mix import tune_mix
    from tritonkit.tuner.rules import RULES

    spec = pm.camera_spec(pipeline_onnx)
    spec["models"][2]["slo"] = {"p95_ms": 50}
    spec["traffic"] = {"camera": 40, "class_head": 60}
    path = write_spec(tmp_path, spec)
    tuning, runs, _ = tune_mix(load_spec(path, tmp_path / "repo"), tmp_path / "repo", tmp_path / "state",
                               tmp_path / "out", max_trials=8, rules=replace(RULES, mix_confirm_s=3.0),
                               write_decision=True, log=lambda s: None)
    assert tuning.confirmed
    mix = json.loads((tmp_path / "out" / "mix.json").read_text())
    assert mix["confirmed"] and mix["scale"] >= 1 and len(mix["runs"]) <= 8
    assert set(mix["confirmation"]) == {"camera", "class_head"}
    for f in mix["confirmation"].values():
        # held against the SLO by the confirmation's own rule (tuning.confirmed): no millisecond ceiling here
        assert f["p95_ms"] > 0 and f["error_ratio"] <= 0.005 and f["requests"] > 0
    assert all(set(run["figures"]) == {"camera", "class_head"} for run in mix["runs"])
    tuned = yaml.safe_load((tmp_path / "tuned.yaml").read_text())
    assert set(tuned["models"]) == {"backbone", "box_head", "class_head"}


def test_tune_mix_needs_a_traffic_mix_and_slos(tmp_path, pipeline_onnx):
    spec = pm.camera_spec(pipeline_onnx)
    path = write_spec(tmp_path, spec)
    r = tritonkit("tune", "--spec", str(path), "--mix", "--repo", str(tmp_path / "repo"))
    assert r.returncode == 2 and "traffic: no traffic mix to tune for" in r.stderr, r.stderr
    spec["traffic"] = {"camera": 20, "box_head": 10, "nope": 5}
    r = tritonkit("tune", "--spec", str(write_spec(tmp_path, spec)), "--mix", "--repo", str(tmp_path / "repo"))
    assert r.returncode == 2 and "traffic.nope: no model or pipeline named 'nope'" in r.stderr, r.stderr
    del spec["traffic"]["nope"]
    r = tritonkit("tune", "--spec", str(write_spec(tmp_path, spec)), "--mix", "--repo", str(tmp_path / "repo"))
    assert r.returncode == 2 and "models[1].slo.p95_ms: box_head is in the traffic mix without a P95 SLO" in r.stderr
    assert not (tmp_path / "repo").exists() and not (tmp_path / "tuned.yaml").exists()
    r = tritonkit("tune", "--spec", str(path), "--repo", str(tmp_path / "repo"))
    assert r.returncode == 2 and "--model/--mix" in r.stderr


def test_a_pipeline_sweep_moves_every_step_together(tmp_path, pipeline_onnx):
    """`sweep --model <pipeline>`: each row gives every step model that max batch, measures the
    pipeline end to end with each step's queue and compute, and the spec's configs are back after."""
    import json

    path = write_spec(tmp_path, pm.camera_spec(pipeline_onnx))
    r = tritonkit("sweep", "--spec", str(path), "--model", "camera", "--rps", "60", "--duration", "2", "--warmup",
                  "1", "--max-batch", "2", "--repo", str(tmp_path / "repo"), "--state-dir", str(tmp_path / "state"),
                  "--out", str(tmp_path / "out"), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads((tmp_path / "out" / "sweep.json").read_text())["rows"]
    assert [row["max_batch_size"] for row in rows] == [1, 2]
    for row in rows:
        assert row["ok"] > 0 and [s["model"] for s in row["steps"]] == ["backbone", "box_head", "class_head"]
        assert all(s["requests"] >= row["ok"] for s in row["steps"])
    assert "max_batch_size: 8" in (tmp_path / "repo" / "backbone" / "config.pbtxt").read_text()
