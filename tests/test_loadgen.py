"""The asyncio load generator and the result schema, against a real tritonserver."""

from __future__ import annotations

import csv
import json

import pytest

from tests.checks import assert_priorities_under_overload
from tritonkit.loadtests.load import Load, RequestClass
from tritonkit.loadtests.measure import measure
from tritonkit.loadtests.results import write_result

pytestmark = [pytest.mark.server, pytest.mark.measures]

CLASSES = [RequestClass("interactive", weight=1, priority=1), RequestClass("bulk", weight=3, priority=2)]


def test_overload_the_higher_priority_class_has_the_lower_p95(served, tmp_path):
    """Offer far more than the model can serve: the bounded queue turns requests away as
    queue_full, and the interactive class (priority 1) overtakes bulk in the queue."""
    result = measure(served.endpoints, "prio", Load(rate=800, duration_s=4, warmup_s=1), CLASSES)
    assert result["engine"] == "asyncio"
    assert_priorities_under_overload(result)

    js, cs = write_result(result, tmp_path)
    assert json.loads(js.read_text())["schema"] == "tritonkit.result/1"
    rows = list(csv.DictReader(cs.open()))
    assert [r["class"] for r in rows] == ["interactive", "bulk", "overall"]


def test_moderate_load_is_served_and_the_generator_keeps_up(served):
    result = measure(served.endpoints, "steady", Load(rate=100, duration_s=3, warmup_s=0.5))
    overall = result["overall"]
    assert overall["ok"] == overall["requests"] > 200
    assert not result["generator"]["saturated"], result["generator"]
    assert result["client_overhead_ms"] is not None


def test_generator_saturation_is_reported(served):
    """Ask for far more than one Python process can send: the run says the generator, not the
    server, was the limit."""
    result = measure(served.endpoints, "steady", Load(rate=20000, duration_s=2, warmup_s=0.5))
    gen = result["generator"]
    assert gen["saturated"] and "load generator, not the server" in gen["warning"]
    assert gen["achieved_rate"] < 20000 * 0.9


def test_sweep_reloads_each_row_writes_the_report_and_restores_the_config(served, tmp_path):
    from tritonkit.configs.loader import load_spec
    from tritonkit.tuner.sweep import sweep

    spec = load_spec(served.spec_path)
    files = sweep(served, spec, served.repo, "sweepable", Load(rate=300, duration_s=1.5, warmup_s=0.5),
                  tmp_path, batch_sizes=(1, 4), log=lambda s: None)
    rows = json.loads(files["sweep.json"].read_text())["rows"]
    assert [r["max_batch_size"] for r in rows] == [1, 4]
    assert max(int(k) for k in rows[0]["batch_histogram"]) == 1  # max_batch_size 1 really was in force
    assert rows[1]["requests"] > 100 and rows[1]["peak_rss_mb"] > 0
    for name in ("sweep.csv", "throughput.png", "latency.png", "decomposition.png", "report.md"):
        assert files[name].stat().st_size > 0
    with served.client() as c:  # the spec's own config is serving again
        assert c.config("sweepable").max_batch_size == spec.model("sweepable").max_batch_size


def test_requests_still_out_after_the_drain_are_counted_not_dropped(served):
    """A drain shorter than the queue's wait: the requests still out are cancelled and counted as
    unanswered, so a verdict counts them as failures rather than judging only the fast ones."""
    import asyncio

    from tritonkit.loadtests.asyncgen import run_load
    from tritonkit.loadtests.load import run_figures

    load = Load(rate=800, duration_s=1.0, warmup_s=0.3, drain_s=0.01)
    out = asyncio.run(run_load(served.endpoints.grpc, "prio", load))
    assert out.unanswered > 0
    figures = run_figures(load, out)
    assert figures.requests == len(out.samples) + out.unanswered
    answered_or_failed = len(out.samples)
    assert figures.error_ratio >= out.unanswered / (answered_or_failed + out.unanswered)
