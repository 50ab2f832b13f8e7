"""Traffic whose lengths vary, padded up to length buckets where requests are made: a text-line
recogniser ([3, 48, W], W from 32 to 320 on a stride of 8) served by the real tritonserver, with
and without padding, from the same length distribution."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from tests.conftest import write_spec
from tritonkit.benchmarks.cases import line_recogniser
from tritonkit.loadtests.load import Load

pytestmark = [pytest.mark.server]

LINE = {"name": "line", "dtype": "FP32", "dims": [3, 48, -1], "min": [3, 48, 32], "opt": [3, 48, 160],
        "max": [3, 48, 320], "stride": 8, "lengths": {"dist": "uniform", "low": 32, "high": 320}}
BATCHING = {"max_queue_delay_us": 8000, "preferred_batch_sizes": [8]}


def _model(name: str, **extra) -> dict:
    return {"name": name, "onnx": "line.onnx", "max_batch_size": 8, "inputs": [LINE], "batching": BATCHING,
            "instances": {"count": 1}, **extra}


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    from tritonkit.configs.generate import generate
    from tritonkit.configs.loader import load_spec
    from tritonkit.serving import running

    root = tmp_path_factory.mktemp("padding")
    line_recogniser(root / "line.onnx")
    padded = {"padding": {"crop": {"logits": {"dim": 0, "per": 4}}}, "build": {"bucket_edges": [64, 160]}}
    spec_path = write_spec(root, {"models": [_model("plain"), _model("padded", **padded)],
                                  "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0}})
    generate(load_spec(spec_path, root / "repo"), root / "repo")
    with running(load_spec(spec_path), root / "repo", root / "state") as r:
        r.root = root
        yield r


def test_padded_requests_answer_what_the_unpadded_line_gives(lines):
    """Lengths between and on the edges, padded, served, cut back (by hand, and by the client from
    the config): equal to ONNX Runtime on the line alone."""
    import onnxruntime as ort

    from tritonkit.clients.padding import crop_outputs, pad_request

    session = ort.InferenceSession(str(lines.root / "line.onnx"), providers=["CPUExecutionProvider"])
    with lines.client() as c:
        rules = c.metadata("padded").rules
        worst = 0.0
        for width in (32, 72, 160, 168, 320):
            x = np.random.default_rng(width).standard_normal((1, 3, 48, width)).astype(np.float32)
            sent, length = pad_request({"line": x}, rules, batched=True)
            assert sent["line"].shape[-1] == {32: 64, 72: 160, 160: 160, 168: 320, 320: 320}[width]
            got = crop_outputs(c.infer("padded", sent), length, {"logits": (0, 4)}, batched=True)["logits"]
            want = session.run(None, {"line": x})[0]
            assert got.shape == want.shape == (1, width // 4, 40)
            # the client does both from the config alone: the edges and the crop it carries
            assert np.array_equal(c.infer("padded", {"line": x}, padded=True)["logits"], got)
            worst = max(worst, float(np.abs(got - want).max()))
    assert worst <= 1e-4, worst


def test_padding_to_buckets_lets_the_batcher_fill_batches(lines):
    """The same lengths at the same rate: unpadded, nearly every length is its own shape and
    batches stay small; padded to three lengths, they batch, at a padding cost the run counts."""
    from tritonkit.loadtests.asyncgen import run_load
    from tritonkit.loadtests.server_stats import breakdown

    load = Load(rate=250, duration_s=3.0, warmup_s=0.5)
    figures = {}
    for name in ("plain", "padded"):
        out = asyncio.run(run_load(lines.endpoints.grpc, name, load))
        assert out.samples and all(s.latency_s is not None for s in out.samples), out.error_examples
        figures[name] = (breakdown(out.stats_before, out.stats_after)["mean_batch"],
                         out.sent_elements / out.real_elements)
    (plain_batch, plain_waste), (padded_batch, padded_waste) = figures["plain"], figures["padded"]
    assert plain_waste == 1.0 and 1.1 < padded_waste < 2.0, figures  # uniform lengths, edges 64/160/320
    assert plain_batch < 1.15 and padded_batch > 1.25 * plain_batch, figures


def test_the_tuner_screens_bucket_edges_side_by_side_on_the_served_model(lines):
    """The tune's edges stage on the real server: each bucket count's least-padding edges, and the
    edges the spec has, measured in the same minutes. Every trial pads as its edges say (its
    measured waste is what the distribution predicts), and what the stage keeps is one it measured."""
    from tritonkit.configs.loader import load_spec
    from tritonkit.tuner.apply import Served
    from tritonkit.tuner.buckets import length_weights, padded_rule, padding_waste
    from tritonkit.tuner.knobs import from_spec
    from tritonkit.tuner.objective import Objective
    from tritonkit.tuner.offline import Search
    from tritonkit.tuner.run import bucket_edge_sets
    from tritonkit.tuner.trials import Trials, TrialWindow

    spec = load_spec(lines.root / "deploy.yaml", lines.root / "repo")
    sets = bucket_edge_sets(spec, "padded", None, print)
    assert len(sets) >= 4 and () in sets
    sets = [s for s in sets if len(s) in (0, 2)]  # one bucket and three: two rounds of three configs
    objective = Objective(200.0, margin=0.0, rps=150.0)  # the lowest P95 at one rate: rounds of one run each
    window = TrialWindow(warmup_s=0.3, duration_s=1.0, drain_s=0.5, max_s=1.0, engine="asyncio")
    trials = Trials(Served(lines), spec, lines.root / "repo", "padded", slo=objective, window=window, log=print)
    search = Search(trials, objective, 8, 100, print, edge_sets=sets)
    try:
        start = search.evaluate(from_spec(spec.model("padded")), "baseline")
        search.max_trials = len(trials.trials) + search.reserved + 2 * (len(sets) + 1) + search.rules.runs
        best, screened = search._bucketed(start)
    finally:
        trials.live.apply(spec)  # the module's other tests find the spec's config served
    runs = [t for t in trials.trials if t.phase == "edges"]
    seen = {tuple(t.knobs.get("bucket_edges", [64, 160])) for t in runs}
    assert seen == {(64, 160), *sets}, seen  # every set measured, the spec's own beside them
    assert best.knobs in screened and best.knobs.edges in (None, *sets)
    rule = next(r for r in lines.client().metadata("padded").rules if r.name == "line")
    weights = length_weights(padded_rule([rule]))
    for t in runs:
        edges = t.knobs.get("bucket_edges", [64, 160])
        expected = padding_waste(weights, tuple(sorted({*edges, 320})))
        assert t.padding_waste == pytest.approx(expected, abs=0.1 + 0.15 * expected), (edges, t.padding_waste)


def test_the_sweep_pads_each_row_to_each_bucket_counts_edges(tmp_path):
    """`sweep --buckets 1 3`: each batch size padded to the max and to three buckets' edges, the
    padding each row sent beside its figures, the recommendation naming its edges; a model that
    does not pad is told what to add, before anything starts."""
    import json

    from tests.conftest import tritonkit

    line_recogniser(tmp_path / "line.onnx")
    padded = _model("line", padding={"crop": {"logits": {"dim": 0, "per": 4}}}, slo={"p95_ms": 200})
    path = write_spec(tmp_path, {"models": [padded, _model("plain")]})
    common = ["--spec", str(path), "--rps", "120", "--duration", "1", "--warmup", "0.5", "--max-batch", "1",
              "--repo", str(tmp_path / "repo"), "--state-dir", str(tmp_path / "state"), "--out", str(tmp_path / "out")]
    r = tritonkit("sweep", "--model", "plain", "--buckets", "1", "3", *common)
    assert r.returncode == 2 and "models[1].padding" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = tritonkit("sweep", "--model", "line", "--buckets", "1", "3", *common, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "out" / "sweep.json").read_text())
    rows = doc["rows"]
    assert [(row["max_batch_size"], len(row["bucket_edges"])) for row in rows] == [(1, 0), (1, 2)]
    assert all(row["ok"] > 0 for row in rows)
    to_max, three = rows[0]["padding_waste"], rows[1]["padding_waste"]
    assert 0.6 < to_max < 1.05 and 0.1 < three < 0.4, (to_max, three)  # uniform 32..320: 0.82 and about 0.24
    rec = doc["recommendation"]
    assert rec["row"] is not None and rec["bucket_edges"] == rows[rec["row"]]["bucket_edges"]
    assert "padded to" in (tmp_path / "out" / "report.md").read_text()


def test_loadtest_by_perf_analyzer_over_shared_memory_pads_as_the_tuner_does(lines, tmp_path):
    """`loadtest --engine perf_analyzer --shared-memory`: the tuner's own client and transport,
    its payloads padded to the model's edges (64/160/320 over uniform widths); the flag without
    perf_analyzer is refused naming it."""
    import json

    from tests.conftest import tritonkit

    common = ["--spec", str(lines.root / "deploy.yaml"), "--model", "padded", "--url", lines.endpoints.grpc,
              "--rps", "150", "--duration", "1.5", "--warmup", "0.5", "--out", str(tmp_path)]
    done = tritonkit("loadtest", *common, "--engine", "asyncio", "--shared-memory")
    assert done.returncode == 2 and "--shared-memory" in done.stderr and "Traceback" not in done.stderr, done.stderr
    done = tritonkit("loadtest", *common, "--engine", "perf_analyzer", "--shared-memory", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["engine"] == "perf_analyzer" and result["overall"]["ok"] > 150
    assert 0.2 < result["padding_waste"] < 0.45, result["padding_waste"]  # 64/160/320 over 32..320: about 0.31


def test_lengths_on_the_command_line_replace_the_specs_for_one_run(tmp_path):
    """`loadtest --lengths line=loguniform:32:320` on a model whose spec draws uniform widths: the
    run pads what the flag's distribution draws (more short lines: more padding to 64/160/320);
    a flag that breaks the input's rules is refused naming the flag, the input and the fix."""
    import json

    from tests.conftest import tritonkit
    from tritonkit.input_rules import InputRule
    from tritonkit.tuner.buckets import length_weights, padding_waste

    line_recogniser(tmp_path / "line.onnx")
    padded = _model("line", padding={}, build={"bucket_edges": [64, 160]})
    path = write_spec(tmp_path, {"models": [padded]})
    common = ["--spec", str(path), "--model", "line", "--rps", "100", "--duration", "1.5", "--warmup", "0.5",
              "--engine", "asyncio", "--repo", str(tmp_path / "repo"), "--state-dir", str(tmp_path / "state"),
              "--out", str(tmp_path / "out")]
    for bad, said in (("line=uniform:32:999", "999 is outside"), ("nope=uniform:32:64", "no input 'nope'"),
                      ("line=gaussian:3:4", "cannot read it"), ("line=uniform:64", "cannot read it")):
        r = tritonkit("loadtest", *common, "--lengths", bad)
        assert r.returncode == 2 and f"--lengths {bad}" in r.stderr and said in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    r = tritonkit("loadtest", *common, "--lengths", "line=loguniform:32:320", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    waste = json.loads((tmp_path / "out" / "result.json").read_text())["padding_waste"]
    rule = InputRule("line", "FP32", (3, 48, -1), min=(3, 48, 32), max=(3, 48, 320), stride=8)
    expect = {dist: padding_waste(length_weights(replace(rule, lengths=(dist, 32, 320))), (64, 160, 320))
              for dist in ("uniform", "loguniform")}
    assert abs(waste - expect["loguniform"]) < abs(waste - expect["uniform"]), (waste, expect)
    assert waste == pytest.approx(expect["loguniform"], abs=0.15), (waste, expect)
