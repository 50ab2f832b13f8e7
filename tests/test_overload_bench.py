"""The overload bench's row: what counts as goodput, a refusal, a late answer and the interactive
class's due, on outcomes built by hand (the bench itself runs in `make bench`); and the refusal
bench, run briefly through a real Envoy."""

from __future__ import annotations

import pytest

from tests.conftest import write_spec
from tritonkit.benchmarks.overload import INTERACTIVE_SHARE, median_row
from tritonkit.loadtests.load import Load, Outcome, Sample
from tritonkit.loadtests.overload_figures import overload_figures


def _sample(cls: str, ms: float | None, kind: str | None = None, failed_ms: float | None = None) -> Sample:
    return Sample(cls, 0.0, 0.0, None if ms is None else ms / 1000, kind,
                  failed_after_s=None if failed_ms is None else failed_ms / 1000)


def test_a_row_counts_goodput_refusals_and_late_answers_as_the_goal_defines_them():
    load = Load(rate=100, duration_s=1.0)
    samples = ([_sample("interactive", 10)] * 20 + [_sample("interactive", 40)] * 5  # 5 late
               + [_sample("bulk", 10)] * 50
               + [_sample("bulk", None, "refused", 1.0)] * 19 + [_sample("bulk", None, "refused", 3.0)]
               + [_sample("bulk", None, "deadline", 25.0)] * 5)  # cut at the SLO: not a refusal
    out = Outcome(samples=samples, unanswered=2)
    row = overload_figures(out, load, claim=80.0, slo_ms=25.0, interactive_share=INTERACTIVE_SHARE)
    assert row["goodput_rps"] == 70 and row["goodput_ratio"] == round(70 / 80, 3)
    # interactive: 25 offered, 20 within; its due is min(25, a quarter of the claim = 20)
    assert row["interactive_offered_rps"] == 25 and row["interactive_within_ratio"] == 1.0
    assert row["refused"] == 20 and row["refusal_p95_ms"] < 25.0  # the 25 ms deadlines are left out
    assert row["late"] == 5 + 2  # answered after the SLO, and still out after the drain
    assert row["errors"] == {"refused": 20, "deadline": 5}


def test_the_runs_of_one_load_are_summed_up_by_their_median_and_spread():
    rows = [{"goodput_ratio": g, "interactive_within_ratio": None, "refusal_p95_ms": 1.0, "late": 0,
             "generator_limited": i == 2, "cpu_percent": {"server": 50.0 + i, "gateway": 5.0, "generator": 30.0}}
            for i, g in enumerate((0.9, 0.7, 0.95))]
    m = median_row(rows)
    assert m["goodput_ratio"] == {"median": 0.9, "min": 0.7, "max": 0.95}
    assert m["interactive_within_ratio"] is None  # nothing to say, not a zero
    assert m["cpu_percent"] == {"server": 51.0, "gateway": 5.0, "generator": 30.0}
    assert m["generator_limited_runs"] == 1


def test_the_gateways_differ_in_where_their_limit_comes_from_and_the_adaptive_filter():
    """At the claim (1,000 req/s, P95 20 ms: L = 20): the fixed gateway with room for Poisson bursts,
    the Little's-law one at L; the closed and adaptive ones at the limit measured (12), interactive's
    share inside each; each an approach of the bench."""
    from tritonkit.benchmarks.overload import APPROACHES, gateway_limits

    limits = gateway_limits(1000, 20, None, 25, measured=12)
    assert set(limits) < set(APPROACHES)
    total = {g: own.max_requests + own.max_requests_high for g, own in limits.items()}
    assert total == {"gateway_fixed": 34, "gateway_little": 20, "gateway_adaptive": 12, "gateway_closed": 12}
    assert limits["gateway_closed"].max_requests_high == 3
    assert limits["gateway_adaptive"].adaptive and limits["gateway_adaptive"].target_p95_ms < 22.5
    assert not any(limits[g].adaptive for g in ("gateway_fixed", "gateway_little", "gateway_closed"))


def test_each_config_is_served_as_written_free_of_queues_and_by_priority_alone(workdir):
    """The three copies the bench serves of each config, generated as Triton will load them: the
    priority copy keeps the levels (two where the config had none) and drops every queue policy,
    the bounded queue that stalls 2.51's batcher included."""
    from tritonkit.benchmarks.overload import served_copies
    from tritonkit.configs.generate import generate, parse
    from tritonkit.configs.loader import load_spec

    policy = {"max_queue_size": 8, "default_timeout_us": 70000, "allow_timeout_override": True}
    written = {"name": "m", "onnx": "onnx/mlp.onnx", "max_batch_size": 4, "slo": {"p95_ms": 50},
               "batching": {"priority_levels": 2, "default_priority": 2, "default_queue_policy": policy,
                            "priority_queue_policies": {1: {"default_timeout_us": 70000}}}}
    tuned = {**written, "max_batch_size": 8, "batching": {"max_queue_delay_us": 500}}
    configs = {}
    for label, model in (("spec", written), ("tuned", tuned)):
        (workdir / label).mkdir()
        (workdir / label / "onnx").symlink_to(workdir / "onnx")
        configs[label] = load_spec(write_spec(workdir / label, {"models": [model]}), workdir / "repo")
    served, names = served_copies(configs, "m")
    generate(served, workdir / "repo")

    def config(name):
        return parse((workdir / "repo" / name / "config.pbtxt").read_text())

    as_written = config(names["spec"].written).dynamic_batching
    assert as_written.priority_levels == 2 and as_written.default_queue_policy.max_queue_size == 8
    assert as_written.priority_queue_policy[1].default_timeout_microseconds == 70000
    for label, batch in (("spec", 4), ("tuned", 8)):
        free, prio = config(names[label].free), config(names[label].priority)
        assert free.max_batch_size == prio.max_batch_size == batch
        assert free.dynamic_batching.priority_levels == 0 and not free.dynamic_batching.HasField("default_queue_policy")
        db = prio.dynamic_batching
        assert (db.priority_levels, db.default_priority_level) == (2, 2), label
        assert not db.HasField("default_queue_policy") and not db.priority_queue_policy, label


def test_behind_a_gateway_each_load_is_a_factor_of_the_claim_made_through_it():
    """As `tune --url` through the gateway would claim: the gateway approaches load and score at the
    claim measured through a proxy, the rest at the claim without one, and the table shows both."""
    from tritonkit.benchmarks.overload import APPROACHES, Copies, _approaches, format_table, median_row

    copies = Copies("m__spec", "m__spec_free", "m__spec_prio")
    gateways = {g: (f"127.0.0.1:{9000 + i}", None)
                for i, g in enumerate(("gateway_fixed", "gateway_adaptive", "gateway_closed"))}
    approaches = {a.name: a for a in _approaches("127.0.0.1:8001", copies, gateways, APPROACHES, 200.0, 170.0)}
    assert {n: a.claim for n, a in approaches.items()} == {
        "queue_policy": 200.0, "gateway_fixed": 170.0, "gateway_adaptive": 170.0, "gateway_closed": 170.0,
        "gateway_priority": 170.0, "gateway_policy": 170.0, "client_throttle": 200.0}
    assert approaches["gateway_closed"].model == copies.priority  # its own Envoy, Triton's priority levels behind
    assert approaches["gateway_fixed"].model == copies.free
    assert approaches["gateway_priority"].url == gateways["gateway_adaptive"][0]  # through the adaptive Envoy
    assert approaches["gateway_priority"].model == copies.priority
    assert approaches["gateway_policy"].model == copies.written  # its queue policies kept, behind Envoy

    row = {"goodput_ratio": 0.9, "goodput_direct_ratio": round(0.9 * 170 / 200, 3), "interactive_within_ratio": 1.2,
           "refusal_p95_ms": 3.0, "late": 0, "generator_limited": False,
           "cpu_percent": {"server": 85.0, "gateway": 13.0, "generator": 25.0}}
    result = {"claim_rps": 200.0, "claim_p95_ms": 80.0, "gateway_claim": {"claim_rps": 170.0, "claim_p95_ms": 85.0},
              "approaches": {"gateway_adaptive": {"1.5": median_row([row])}}}
    head, _, line = format_table("spec", result)
    assert "claim 200 req/s" in head and "through the gateway 170 req/s" in head
    assert "0.90 (0.90-0.90)" in line and "0.77 (0.77-0.77)" in line


@pytest.mark.server
def test_the_refusal_bench_times_refusals_alone_and_beside_a_busy_neighbour(workdir):
    """The refusal bench through a real Envoy in front of the real server: every bulk request sent in
    each condition is refused (the model's metadata and statistics pass on the control route), and
    each condition's figures come from those refusals alone."""
    from tritonkit.benchmarks.refusal import CONDITIONS, run_refusal_bench
    from tritonkit.configs.loader import load_spec

    pytest.importorskip("envoy")
    spec = load_spec(write_spec(workdir, {"models": [{"name": "m", "onnx": "onnx/mlp.onnx", "max_batch_size": 4}],
                                          "server": {"http_port": 0, "grpc_port": 0, "metrics_port": 0}}),
                     workdir / "repo")
    lines = []
    result = run_refusal_bench(spec, "m", workdir / "repo", workdir / "state", workdir / "out", rate=100,
                               seconds=1.0, runs=1, log=lines.append)
    assert set(result["conditions"]) <= set(CONDITIONS) and "alone" in result["conditions"]
    assert "busy neighbour" in result["conditions"]
    for condition, c in result["conditions"].items():
        (run,) = c["runs"]
        assert run["refused"] >= 50, (condition, run)  # about 100 sent in the window, each one refused
        assert 0 < c["p50_ms"]["median"] <= c["p95_ms"]["median"]
    assert (workdir / "out" / "bench_refusal.json").is_file()
    assert any(line.strip().startswith("alone") for line in lines)
