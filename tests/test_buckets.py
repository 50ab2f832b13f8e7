"""Bucket edges for a length distribution (tuner/buckets.py): the least padding for a bucket count,
checked against every choice of edges, and the count kept from measured claims."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from tritonkit.input_rules import InputRule
from tritonkit.tuner.buckets import COUNTS, best_edges, choose, edge_sets, length_weights, padding_waste


def _mean_padded(weights: dict[int, float], edges: tuple[int, ...], max_len: int) -> float:
    targets = sorted({*edges, max_len})
    return sum(w * min(t for t in targets if t >= n) for n, w in weights.items())


@pytest.mark.parametrize("dist", ["uniform", "loguniform"])
@pytest.mark.parametrize("buckets", [2, 3, 4])
def test_the_edges_pad_least_of_every_choice(dist, buckets):
    rule = InputRule("line", "FP32", (3, 48, -1), min=(3, 48, 32), max=(3, 48, 160), stride=8,
                     lengths=(dist, 32, 160))
    weights = length_weights(rule, draws=5000)
    edges = best_edges(weights, buckets, 160)
    assert len(edges) == buckets - 1 and all(e % 8 == 0 and e < 160 for e in edges)
    below = [n for n in weights if n < 160]
    brute = min(_mean_padded(weights, c, 160) for c in itertools.combinations(below, buckets - 1))
    assert _mean_padded(weights, edges, 160) == pytest.approx(brute)
    # the waste is what those edges pad, and falls as buckets are added
    assert padding_waste(weights, (*edges, 160)) < padding_waste(weights, (160,))
    assert padding_waste(weights, None) == 0.0


def test_the_count_kept_is_the_fewest_buckets_within_a_tie_of_the_best():
    assert choose({1: 300.0, 2: 565.0, 3: 540.0, 4: 590.0}) == 2  # 565 is within 5% of 590
    assert choose({1: 300.0, 2: 400.0, 3: 600.0}) == 3
    assert choose({0: 1300.0, 1: 1050.0, 3: 1159.0}) == 0  # unpadded beats every count by more than 5%
    assert choose({0: 1200.0, 1: 1050.0, 3: 1159.0}) == 3  # within a tie: padding, for its batches


def test_a_tune_screens_one_edge_set_per_bucket_count():
    """The least-padding edges for each count, the last bucket padded to the max; none where no
    input both pads and draws its lengths from a distribution."""
    rule = InputRule("line", "FP32", (3, 48, -1), min=(3, 48, 32), max=(3, 48, 320), stride=8,
                     lengths=("uniform", 32, 320), pad_to=(320,))
    sets = edge_sets([rule], counts=(1, 2, 3))
    assert sets[0] == () and [len(s) for s in sets] == [0, 1, 2]
    assert all(e < 320 and e % 8 == 0 for s in sets for e in s)
    assert edge_sets([replace(rule, lengths=None)]) == []
    assert edge_sets([replace(rule, pad_to=None)]) == []


def test_tuned_edges_are_written_applied_and_padded_to(tmp_path):
    """A tune's edges go to tuned.yaml as build.bucket_edges; the spec then pads up to them (and the
    build makes a profile per edge); anything else under build is refused with where and how."""
    from tests.conftest import write_spec
    from tritonkit.benchmarks.cases import line_recogniser
    from tritonkit.configs.generate import input_rules, resolve
    from tritonkit.configs.loader import load_spec
    from tritonkit.errors import InputError
    from tritonkit.tuner.knobs import Knobs
    from tritonkit.tuner.outputs import write_tuned
    from tritonkit.tuner.run import bucket_edge_sets

    line_recogniser(tmp_path / "line.onnx")
    line = {"name": "line", "dtype": "FP32", "dims": [3, 48, -1], "min": [3, 48, 32], "opt": [3, 48, 160],
            "max": [3, 48, 320], "stride": 8, "lengths": {"dist": "uniform", "low": 32, "high": 320}}
    path = write_spec(tmp_path, {"models": [{"name": "line", "onnx": "line.onnx", "max_batch_size": 8,
                                             "inputs": [line], "padding": {}, "slo": {"p95_ms": 50}}]})
    spec = load_spec(path)
    assert input_rules(resolve(spec, spec.model("line")))[0].pad_to == (320,)
    # the spec pads to the max already: a tune screens the other counts beside it, not it again
    sets = bucket_edge_sets(spec, "line", None, lambda s: None)
    assert () not in sets and len(sets) == len(COUNTS) - 1
    about = {"version": "2.51.0", "url": "localhost:8001", "backend": "onnxruntime", "started_by": "test"}
    tuned = write_tuned(spec, "line", Knobs(8, 2000, 2, edges=(104, 200)), about)
    again = load_spec(path)
    assert again.model("line").build.bucket_edges == [104, 200]
    assert input_rules(resolve(again, again.model("line")))[0].pad_to == (104, 200, 320)
    tuned.write_text("models:\n  line:\n    build: {atol: 0.1}\n")
    with pytest.raises(InputError) as e:
        load_spec(path)
    assert "tuned.yaml" in str(e.value) and "models.line.build" in str(e.value) and "bucket_edges" in str(e.value)
