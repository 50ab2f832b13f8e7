"""Bucket edges for a length distribution (tuner/buckets.py): the least padding for a bucket count,
checked against every choice of edges, and the count kept from measured claims."""

from __future__ import annotations

import itertools

import pytest

from tritonkit.input_rules import InputRule
from tritonkit.tuner.buckets import best_edges, choose, length_weights, padding_waste


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
