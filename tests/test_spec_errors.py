"""Seeded spec mistakes: each gets its own message naming the field, exit code 2, no traceback,
and the repository generated earlier is left byte for byte as it was."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import pytest

from tests.conftest import tritonkit, write_spec

VALID = {
    "models": [{
        "name": "m",
        "onnx": "onnx/mlp.onnx",
        "max_batch_size": 8,
        "inputs": [{"name": "input", "dtype": "FP32", "dims": [256]}],
        "batching": {
            "preferred_batch_sizes": [2, 4],
            "max_queue_delay_us": 1000,
            "priority_levels": 2,
            "default_priority": 2,
            "default_queue_policy": {"default_timeout_us": 50000, "max_queue_size": 16},
        },
    }],
}


def _m(d):
    return d["models"][0]


def corrupt_onnx(folder: Path, d):
    (folder / "corrupt.onnx").write_bytes(b"\x08\x07garbage that is not a protobuf model" * 10)
    _m(d)["onnx"] = "corrupt.onnx"


# (id, mutation, field path the message must name, words the message must contain)
CASES = [
    ("preferred_above_max", lambda f, d: _m(d)["batching"].update(preferred_batch_sizes=[2, 64]),
     "models[0].batching.preferred_batch_sizes[1]", "64 is above max_batch_size 8"),
    ("priority_outside_levels", lambda f, d: _m(d)["batching"].update(default_priority=3),
     "models[0].batching.default_priority", "outside the priority levels 1..2"),
    ("unknown_dtype", lambda f, d: _m(d)["inputs"][0].update(dtype="FLOAT32"),
     "models[0].inputs[0].dtype", "'FLOAT32' is not allowed"),
    ("input_not_in_onnx", lambda f, d: _m(d)["inputs"][0].update(name="pixels"),
     "models[0].inputs[0].name", "'pixels' is not an input of the ONNX graph"),
    ("wrong_rank", lambda f, d: _m(d)["inputs"][0].update(dims=[1, 256]),
     "models[0].inputs[0].dims", "rank 2 [1, 256] does not match the ONNX graph's rank 1"),
    ("preserve_ordering_two_levels", lambda f, d: _m(d)["batching"].update(preserve_ordering=True),
     "models[0].batching.preserve_ordering", "cannot be combined with 2 priority levels"),
    ("negative_delay", lambda f, d: _m(d)["batching"].update(max_queue_delay_us=-5),
     "models[0].batching.max_queue_delay_us", "greater than or equal to 0"),
    ("timeout_below_delay", lambda f, d: _m(d)["batching"]["default_queue_policy"].update(default_timeout_us=500),
     "models[0].batching.default_queue_policy.default_timeout_us", "is not above max_queue_delay_us 1000"),
    ("missing_onnx", lambda f, d: _m(d).update(onnx="onnx/nope.onnx"),
     "models[0].onnx", "file not found"),
    ("corrupt_onnx", corrupt_onnx, "models[0].onnx", "cannot read"),
    ("duplicate_names", lambda f, d: d["models"].append(copy.deepcopy(_m(d))),
     "models[1].name", "'m' is used by more than one model"),
    ("unknown_key", lambda f, d: _m(d)["batching"].update(max_queue_delay_ms=3),
     "models[0].batching.max_queue_delay_ms", "unknown key"),
    ("lengths_outside_range", lambda f, d: _m(d).update(onnx="onnx/seq_mean.onnx", inputs=[
        {"name": "x", "dtype": "FP32", "dims": [-1], "min": [1], "opt": [4], "max": [16],
         "lengths": {"dist": "loguniform", "low": 2, "high": 40}}]),
     "models[0].inputs[0].lengths", "40 is outside the input's range 1..16"),
    ("padding_without_max", lambda f, d: _m(d).update(onnx="onnx/seq_mean.onnx", padding={}, inputs=[
        {"name": "x", "dtype": "FP32", "dims": [-1], "lengths": {"dist": "uniform", "low": 2, "high": 9}}]),
     "models[0].inputs[0].max", "the model pads requests"),
    ("edge_off_stride", lambda f, d: _m(d).update(onnx="onnx/seq_mean.onnx", padding={},
                                                  build={"bucket_edges": [6]}, inputs=[
        {"name": "x", "dtype": "FP32", "dims": [-1], "min": [4], "opt": [8], "max": [16], "stride": 4}]),
     "models[0].build.bucket_edges[0]", "6 is not a multiple of the input's stride 4"),
]


def _snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def generated(workdir):
    spec = write_spec(workdir, VALID)
    res = tritonkit("configs", "--spec", str(spec), "--out", str(workdir / "repo"))
    assert res.returncode == 0, res.stderr
    return workdir


def test_valid_spec_generates(generated):
    assert (generated / "repo/m/config.pbtxt").is_file()
    assert (generated / "repo/m/1/model.onnx").is_file()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_seeded_mistake(generated, case):
    _id, mutate, path, words = case
    before = _snapshot(generated / "repo")
    data = copy.deepcopy(VALID)
    mutate(generated, data)
    spec = write_spec(generated, data)
    res = tritonkit("configs", "--spec", str(spec), "--out", str(generated / "repo"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    line = next((ln for ln in res.stderr.splitlines() if path + ":" in ln), None)
    assert line is not None, f"no message names {path}:\n{res.stderr}"
    assert words in line, line
    assert str(spec) in line  # the file is named too
    assert _snapshot(generated / "repo") == before  # nothing on disk changed


def test_messages_are_distinct(generated, capsys):
    """Each seeded mistake produces its own message (not one generic 'invalid spec'). In-process:
    the console script's exit code and stderr for each case are test_seeded_mistake's."""
    from tritonkit.cli import main

    seen = set()
    for _id, mutate, path, _ in CASES:
        data = copy.deepcopy(VALID)
        mutate(generated, data)
        capsys.readouterr()
        assert main(["validate", "--spec", str(write_spec(generated, data))]) == 2
        message = next(ln for ln in capsys.readouterr().err.splitlines() if path + ":" in ln)
        seen.add(message.split(path + ":", 1)[1])
    assert len(seen) == len(CASES)


def test_every_problem_reported_at_once(generated):
    data = copy.deepcopy(VALID)
    _m(data)["batching"].update(preferred_batch_sizes=[64], default_priority=5)
    _m(data)["inputs"][0].update(dtype="FP16")
    res = tritonkit("validate", "--spec", str(write_spec(generated, data)))
    assert res.returncode == 2
    for path in ("preferred_batch_sizes[0]", "default_priority", "inputs[0].dtype"):
        assert path in res.stderr


def test_yaml_syntax_error_and_missing_file(workdir):
    bad = workdir / "deploy.yaml"
    bad.write_text("models:\n  - name: [unclosed\n")
    res = tritonkit("validate", "--spec", str(bad))
    assert res.returncode == 2 and "not valid YAML" in res.stderr and "line" in res.stderr
    res = tritonkit("validate", "--spec", str(workdir / "absent.yaml"))
    assert res.returncode == 2 and "spec file not found" in res.stderr
    assert "Traceback" not in res.stderr
