"""Model Analyzer as a peer and the perf_analyzer judge, against the real server: MA searches a
repository the kit generates from its own spec, its checkpoint is read back, and the judge scores
configs served side by side, counting a queue policy's refusals instead of failing on the first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import write_spec
from tritonkit.benchmarks.judge import Entrant, judge
from tritonkit.benchmarks.model_analyzer import best, peer_start, read_checkpoint, run_model_analyzer, winner_model
from tritonkit.configs.loader import load_spec
from tritonkit.spec import QueuePolicy


def _spec(workdir, onnx="onnx/mlp.onnx", **batching):
    return load_spec(write_spec(workdir, {"models": [{
        "name": "peer_mlp", "onnx": onnx, "max_batch_size": 8, "instances": {"count": 1},
        "batching": {"preferred_batch_sizes": [4, 8], "max_queue_delay_us": 1000, **batching},
        "slo": {"p95_ms": 50}}]}))


def test_the_start_ma_gets_leaves_out_what_it_cannot_vary_and_says_so(workdir):
    spec = _spec(workdir, default_queue_policy={"max_queue_size": 4, "default_timeout_us": 5000})
    start, left_out = peer_start(spec.model("peer_mlp"))
    assert start.batching.preferred_batch_sizes == [] and start.batching.default_queue_policy is None
    assert not start.warmup and start.batching.max_queue_delay_us == 1000
    assert left_out == ["preferred_batch_sizes [4, 8]", "the queue policies", "the warm-up samples"]
    winner = {"max_batch_size": 2, "instances": 2, "max_queue_delay_us": 0, "preferred_batch_sizes": [],
              "dynamic_batching": True}
    m = winner_model(start, winner)
    assert (m.max_batch_size, m.instances.count, m.batching.max_queue_delay_us) == (2, 2, 0)


def test_the_checkpoint_reader_and_ma_pick(tmp_path):
    def variant(batch, count, measured):
        cfg = {"maxBatchSize": batch, "instanceGroup": [{"count": count, "kind": "KIND_CPU"}], "dynamicBatching": {}}
        run = {"_model_run_configs": [{"_model_config_variant": {"model_config": cfg}}]}
        ms = {f"m{i}": {"_model_config_measurements": [{
            "_model_specific_pa_params": {"concurrency-range": c},
            "_non_gpu_data": [["perf_throughput", {"_value": rps}], ["perf_latency_p95", {"_value": p95}]]}]}
            for i, (c, rps, p95) in enumerate(measured)}
        return [run, ms]

    path = tmp_path / "0.ckpt"
    path.write_text(json.dumps({"ResultManager.results": {"_results": {"m": {
        "m_config_default": variant(8, 1, [(16, 900.0, 40.0)]),
        "m_config_0": variant(1, 2, [(2, 500.0, 5.0), (4, 700.0, 9.0)])}}}}))
    measured = read_checkpoint(path, "m")
    assert len(measured) == 3 and measured[0]["max_batch_size"] == 8 and measured[2]["instances"] == 2
    assert best(measured, 10)["throughput_rps"] == 700.0  # the fastest within the P95
    assert best(measured, 50)["variant"] == "m_config_default"
    assert best(measured, 1) is None


@pytest.mark.server
@pytest.mark.measures
def test_model_analyzer_searches_the_kits_repository_within_its_bounds(workdir):
    """MA's quick search on a spec the kit writes (preferred sizes, queue policy, warm-up: all of
    which stop MA when left in), bounded to one instance and max batch 2, and stopped after its
    second measurement: it measures configs, the kit reads them and names a winner within the P95.
    The count bounds it; the wall time is only a guard far above what two measurements take on a
    busy box, so that a slow minute cannot stop it after one."""
    spec = _spec(workdir, default_queue_policy={"max_queue_size": 4})
    r = run_model_analyzer(spec, "peer_mlp", workdir / "ma", p95_ms=50, max_instances=1, max_batch=2, wall_s=600,
                           window_ms=500, max_measurements=2, pa_windows=3, log=lambda s: None)
    assert len(r["configs"]) >= 2, r
    assert {m["instances"] for m in r["configs"]} == {1}
    assert max(m["max_batch_size"] for m in r["configs"]) <= 8  # the start's 8, then MA's own <= 2
    within = [m for m in r["configs"] if m["p95_ms"] is not None and m["p95_ms"] <= 50]
    assert (r["winner"] is None) == (not within), r  # a winner exactly when a config met the P95 limit
    assert r["winner"] is None or r["winner"] in within
    assert r["search_s"] <= r["wall_s"]  # its last new measurement lies within its run
    assert r["stopped"] == "finished" or r["stopped"].startswith("stopped by the kit"), r["stopped"]
    assert (workdir / "ma" / "model_analyzer.json").exists()


@pytest.mark.server
@pytest.mark.measures
def test_the_judge_scores_configs_side_by_side_and_counts_refusals(workdir):
    """Two configs of one model in one server: a normal one holds a rate; one whose one-deep queue
    refuses requests makes perf_analyzer give up, and the judge measures that run again with a
    client that counts the refusals, rather than stopping."""
    spec = _spec(workdir, onnx="onnx/mlp_slow.onnx")  # a few ms a request: one queue slot overflows
    m = spec.model("peer_mlp")
    tiny = m.model_copy(update={"batching": m.batching.model_copy(update={
        "preferred_batch_sizes": [], "max_queue_delay_us": 0,
        "default_queue_policy": QueuePolicy(max_queue_size=1)}), "max_batch_size": 1})
    j = judge(spec, "peer_mlp", [Entrant("plain", m, claim_rps=120), Entrant("tiny", tiny, claim_rps=150)],
              workdir / "judge", p95_ms=50, rounds=1, seconds=1.0, floor_rps=100, climb_limit=1.0,
              log=lambda s: None)
    plain, refusing = j["entrants"]["plain"], j["entrants"]["tiny"]
    assert plain["rps"] > 0 and plain["runs"] >= 1
    runs = [r for r in j["runs"] if r["entrant"] == "tiny"]
    assert refusing["fallback_runs"] >= 1 and any(r["error_ratio"] > 0 for r in runs), runs
    first = {name: next(r["rate"] for r in j["runs"] if r["entrant"] == name) for name in ("plain", "tiny")}
    # one start for both, a rung above the highest claim
    assert first == {"plain": pytest.approx(172.5, abs=0.1), "tiny": pytest.approx(172.5, abs=0.1)}
    assert all(r["rate"] >= 100 for r in j["runs"])  # the ladder stopped at its floor


@pytest.mark.parametrize("case", ["mlp", "detector", "tiny", "latency", "convnet", "wide"])
def test_every_versus_case_is_a_valid_naive_start_that_runs(tmp_path, case):
    """Each case's spec passes the kit's rules, starts where a new user does (one instance, no
    queue delay), and its model runs in ONNX Runtime at the shape requests will carry."""
    import numpy as np
    import onnxruntime as ort

    from tritonkit.benchmarks.cases import write_case

    spec = load_spec(write_case(case, tmp_path), tmp_path / "repo")
    m = spec.models[0]
    assert m.instances.count == 1 and m.batching.max_queue_delay_us == 0 and m.max_batch_size > 1
    assert (m.slo.rps is not None) == (case == "latency")
    session = ort.InferenceSession(str(spec.onnx_path(m)), providers=["CPUExecutionProvider"])
    x = session.get_inputs()[0]
    shape = [2, *(m.inputs[0].opt if m.inputs else [int(d) for d in x.shape[1:]])]
    assert np.isfinite(session.run(None, {x.name: np.ones(shape, np.float32)})[0]).all()


def test_ma_is_asked_for_the_kits_objective_and_picks_by_it():
    from tritonkit.benchmarks.model_analyzer import objectives

    assert objectives(25, None) == {"constraints": {"perf_latency_p95": {"max": 25}}}
    latency = objectives(25, 400)
    assert latency["constraints"]["perf_throughput"] == {"min": 400} and "perf_latency_p95" in latency["objectives"]
    measured = [{"variant": "a", "throughput_rps": 900.0, "p95_ms": 20.0},
                {"variant": "b", "throughput_rps": 450.0, "p95_ms": 6.0},
                {"variant": "c", "throughput_rps": 300.0, "p95_ms": 3.0}]
    assert best(measured, 25)["variant"] == "a"
    assert best(measured, 25, rps=400)["variant"] == "b"  # the lowest P95 that serves the rate


def test_the_noise_source_burns_a_core_in_bursts_and_stops_with_its_block(tmp_path):
    """The noisy neighbour of `bench versus --noise-source`: a real process that spins, stopped by its
    own process id when the block ends; what it took is read from the bursts it logged."""
    import os
    import time

    from tritonkit.benchmarks.noise_source import noise_source, summary

    def cpu_ticks(pid: int) -> int:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11])  # utime

    with noise_source(tmp_path / "noise.log", seed=1) as took:
        pid = took["pid"]
        deadline = time.monotonic() + 30
        while cpu_ticks(pid) < 10 and time.monotonic() < deadline:  # it spins: a tenth of a second of CPU
            time.sleep(0.05)
        assert cpu_ticks(pid) >= 10
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert took["seconds"] > 0 and 0.0 <= took["busy_share"] <= 1.0
    (tmp_path / "log").write_text('{"at": 0, "busy_s": 2.0}\n{"at": 5, "busy_s": 1.0}\n')
    assert summary(tmp_path / "log", 9.0) == {"seconds": 9.0, "busy_s": 3.0, "bursts": 2, "busy_share": 0.333}


def _versus_result(case: str, rps: float | None, kit: dict, ma: dict, noise: dict | None = None) -> dict:
    side = {"measurements": 36, "configs": 12, "confirmed": True, "kept": False, "written": True,
            "differs_because": None}
    return {"schema": 1, "kind": "bench/versus", "case": case, "model": case, "p95_ms": 20.0, "rps": rps,
            "engine": "perf_analyzer", "noise_source": noise,
            "sides": {"kit1": {**side, **kit}, "model_analyzer": {"measurements": 8, "configs": 8, **ma}}}


def test_the_versus_table_puts_every_tuning_beside_model_analyzer(tmp_path):
    """The table a `bench versus` run leaves (versus/versus.md, and `--table` from its folder): the
    judged figure and the time over Model Analyzer's, the written config beside the best measured one,
    a latency case's ratio the right way up; a folder with no case is exit 2 naming the flag."""
    from tests.conftest import tritonkit
    from tritonkit.benchmarks.versus import read_versus, versus_table

    convnet = _versus_result(
        "convnet", None,
        {"search_s": 150.0, "search_proper_s": 90.0, "winner": "batch 4 delay 0 us x2",
         "best_measured": ["batch 8 delay 0 us x2", 2600.0], "differs_because": "within one rung",
         "confirmed": False, "judged": {"rps": 2400.0, "rounds_rps": [2400.0, 2500.0, 2300.0]}},
        {"search_s": 300.0, "wall_s": 450.0, "winner": "batch 4 x2",
         "judged": {"rps": 2000.0, "rounds_rps": [2000.0, 1900.0, 2100.0]}},
        noise={"busy_share": 0.33, "bursts": 100, "seconds": 900})
    latency = _versus_result(
        "latency", 400.0,
        {"search_s": 100.0, "search_proper_s": 60.0, "winner": "batch 16 delay 0 us x1",
         "best_measured": None, "judged": {"p95_ms": 12.0, "rounds_p95_ms": [12.0, 13.0, 11.5]}},
        {"search_s": 200.0, "wall_s": 300.0, "winner": "batch 2 x1",
         "judged": {"p95_ms": 48.0, "rounds_p95_ms": [48.0, None, 50.0]}})
    for r in (convnet, latency):
        (tmp_path / "versus" / r["case"]).mkdir(parents=True)
        (tmp_path / "versus" / r["case"] / "bench_versus.json").write_text(json.dumps(r))
    found = read_versus(tmp_path / "versus")
    assert [r["case"] for r in found] == ["latency", "convnet"]  # in the order of CASES
    rows = {line.split(" | ")[1]: line for line in versus_table([convnet]).splitlines()[2:]}
    kit = rows["kit1 (unconfirmed)"]
    assert "beside the noise source (33% of a core)" in kit
    assert "| 150 (90) |" in kit and "| 36 (12) |" in kit
    assert "| batch 4 delay 0 us x2 | batch 8 delay 0 us x2, 2,600 (within one rung) |" in kit
    assert "| 2,400 (2,400, 2,500, 2,300) | 1.20x; 0.50 (0.30) |" in kit
    assert "| 300 (wall 450) |" in rows["Model Analyzer"]
    kit_latency = next(line for line in versus_table([latency]).splitlines() if "| kit1 |" in line)
    assert "P95 12.0 ms (12.0, 13.0, 11.5)" in kit_latency and "4.00x lower P95; 0.50 (0.30)" in kit_latency

    done = tritonkit("bench", "versus", "--table", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "versus" / "versus.md").read_text().count("| kit1") == 2
    empty = tritonkit("bench", "versus", "--table", "--out", str(tmp_path / "none"))
    assert empty.returncode == 2 and "--table" in empty.stderr and "Traceback" not in empty.stderr, empty.stderr


def test_an_earlier_sitting_is_judged_again_from_the_configs_it_wrote(tmp_path):
    """`bench versus --rejudge-from`: each tuning's written config comes back from its record, queue
    policy and all, and Model Analyzer's winner on the case's start; a record without the written
    config, and the flags that contradict a quiet judge, are exit 2 naming the field or flag."""
    from tests.conftest import tritonkit
    from tritonkit.benchmarks.cases import write_case
    from tritonkit.benchmarks.versus import earlier_sitting, read_earlier, versus_table
    from tritonkit.errors import InputError
    from tritonkit.tuner.knobs import Knobs

    start = load_spec(write_case("tiny", tmp_path / "case"), tmp_path / "case" / "repo").models[0]
    written = Knobs(4, 500, 2, queue=QueuePolicy(max_queue_size=8, default_timeout_us=9000))
    ma = {"winner": {"max_batch_size": 2, "instances": 2, "max_queue_delay_us": 0, "preferred_batch_sizes": [],
                     "dynamic_batching": True}}
    r = _versus_result("tiny", None, {"config": written.to_json(), "claim_rps": 900.0, "search_s": 150.0,
                                      "search_proper_s": 90.0, "winner": written.label(),
                                      "judged": {"rps": 800.0, "rounds_rps": [800.0]}},
                       {**ma, "search_s": 300.0, "wall_s": 450.0, "winner": "batch 2 x2"},
                       noise={"busy_share": 0.31, "bursts": 90, "seconds": 800})
    r["model_analyzer"] = ma
    (tmp_path / "earlier" / "tiny").mkdir(parents=True)
    (tmp_path / "earlier" / "tiny" / "bench_versus.json").write_text(json.dumps(r))
    file, earlier = read_earlier(tmp_path / "earlier", "tiny")
    sitting = earlier_sitting(file, earlier, start)
    kit, peer = sitting.entrants
    assert kit.name == "kit1" and kit.model == written.model(start)
    assert kit.model.batching.default_queue_policy.max_queue_size == 8 and kit.model.instances.count == 2
    assert peer.name == "model_analyzer" and (peer.model.max_batch_size, peer.model.instances.count) == (2, 2)
    assert sitting.claims == {"kit1": 900.0}
    assert sitting.sides["kit1"]["earlier_judged"]["rps"] == 800.0 and "judged" not in sitting.sides["kit1"]

    del earlier["sides"]["kit1"]["config"]
    with pytest.raises(InputError) as e:
        earlier_sitting(file, earlier, start)
    assert e.value.problems[0].path == "sides.kit1.config" and e.value.problems[0].file == str(file)

    # searched beside the source, judged without it: the table says both
    r["judged_beside_noise"] = False
    assert "beside the noise source (31% of a core), judged without it" in versus_table([r])
    for flags, named in ((["--quiet-judge"], "--quiet-judge"),
                         (["--noise-source", "--rejudge-from", str(tmp_path / "earlier")], "--rejudge-from")):
        done = tritonkit("bench", "versus", "--case", "tiny", *flags, "--out", str(tmp_path / "out"))
        assert done.returncode == 2 and named in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_a_measurement_under_way_is_progress_not_a_stall():
    """Model Analyzer's log as it stood when the kit stopped it beside the noise source: one
    measurement of wide had been widening perf_analyzer's window for three minutes. That is a
    search still measuring; a search only revisiting what it has logs no measurement begun."""
    from tritonkit.benchmarks.model_analyzer import _under_way

    head = ("[Model Analyzer] Creating model config: wide_config_1\n"
            "[Model Analyzer] Profiling wide_config_1: concurrency=4\n")
    widening = "[Model Analyzer] perf_analyzer's measurement window is too small, increased to 7000 ms.\n"
    assert _under_way(head) and _under_way(head + widening)
    assert not _under_way(head + widening + "[Model Analyzer] Saved checkpoint to x/0.ckpt\n")
    revisiting = ("[Model Analyzer] Found existing model config: wide_config_1\n"
                  "[Model Analyzer] Existing measurement found for run config. Skipping profile\n"
                  "[Model Analyzer] No changes made to analyzer data, no checkpoint saved.\n")
    assert not _under_way(head + "[Model Analyzer] Saved checkpoint to x/0.ckpt\n" + revisiting)
    assert not _under_way("")
