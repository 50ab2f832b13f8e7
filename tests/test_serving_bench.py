"""`tritonkit bench serving` against a real tritonserver (a small model, short turns): the runner's
timing counters reach the bench through the stub's environment, and the breakdown holds together.
Speed targets live in `make bench`; nothing here compares a time with a measured value."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tritonkit import runner_timings
from tritonkit.benchmarks.serving import run_serving_bench


def test_timing_counters_of_every_instance_add_up(tmp_path, monkeypatch):
    monkeypatch.setenv(runner_timings.ENV, str(tmp_path))
    a, b = runner_timings.counters("m_0_0"), runner_timings.counters("m_0_1")
    other = runner_timings.counters("m2_0_0")  # another model whose name starts the same way
    a[runner_timings.EXECUTES] += 2
    b[runner_timings.EXECUTES] += 3
    b[runner_timings.ORT_NS] += 7
    other[runner_timings.EXECUTES] += 100
    for c in (a, b, other):
        c.flush()
    total = runner_timings.read(tmp_path, "m_")
    assert total["executes"] == 5 and total["ort_ns"] == 7
    monkeypatch.delenv(runner_timings.ENV)
    assert runner_timings.counters("m_0_0") is None  # off unless asked for


@pytest.mark.server
@pytest.mark.measures
def test_bench_serving_breaks_the_served_time_down(tmp_path):
    bench = run_serving_bench(tmp_path, max_batch=4, seconds=1.0, rounds=2, width=64, layers=2, log=lambda s: None)
    assert [r["batch"] for r in bench["rows"]] == [1, 4]
    for row in bench["rows"]:
        assert set(row["clients"]) == {"asyncio", "perf_analyzer"} and row["raw"]["rps"] > 0
        for x in row["clients"].values():  # each client drove the served side
            s = x["served"]
            assert s["ok"] > 0 and s["errors"] == 0
            assert x["served_over_raw"] > 0 and len(x["per_round"]) == 2
            # The runner's counters came back from the stub: execute wraps the ORT call.
            r = s["runner"]
            assert r["ort_calls_per_execute"] >= 1
            assert 0 < r["ort_ms"] <= r["execute_ms"]
            assert s["compute_infer_ms"] > 0 and s["executions"] > 0
    for x in bench["light_load"]["clients"].values():
        assert x["served_p50_ms"] > 0 and np.isfinite(x["added_p50_ms"])
    written = json.loads((tmp_path / "bench_serving.json").read_text())
    assert written["kind"] == "bench/serving" and written["targets"] == bench["targets"]
