"""Bucket edges for the lengths a model's traffic carries.

Padding a request up to the next edge lets requests of similar length batch together; every edge
is one more shape the batcher keeps apart (and one more TensorRT profile). Given the distribution,
the edges that waste least for a number of buckets follow exactly (dynamic programming over the
lengths the stride allows); how many buckets pay is the server's to say, so it is measured: the
count whose highest rate within the SLO is best wins, the fewer buckets on a tie.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from tritonkit.configs.generate import input_rules, resolve
from tritonkit.input_rules import InputRule
from tritonkit.inputs import draw_length
from tritonkit.spec import Spec

TIE = 0.05  # claims within 5% of the best are a tie on this box: the fewer buckets win
COUNTS = (1, 2, 3, 4, 6)  # bucket counts a tune tries: more than six shapes split batches past use


def length_weights(rule: InputRule, draws: int = 20000, seed: int = 0) -> dict[int, float]:
    """The share of requests at each length, as the sampler draws them."""
    rng = np.random.default_rng(seed)
    counts = Counter(draw_length(rule, rng) for _ in range(draws))
    return {n: c / draws for n, c in sorted(counts.items())}


def best_edges(weights: dict[int, float], buckets: int, max_len: int) -> tuple[int, ...]:
    """The `buckets - 1` edges below `max_len` (the last bucket pads to it) that minimise the mean
    padded length: a bucket holding lengths a..b pads them all to b."""
    lengths = [n for n in sorted(weights) if n < max_len]
    if buckets <= 1 or not lengths:
        return ()
    p = np.array([weights[n] for n in lengths])
    cum = np.concatenate([[0.0], np.cumsum(p)])
    tail = cum[-1]  # whatever falls above the last edge pads to max_len
    g, k = len(lengths), min(buckets - 1, len(lengths))
    # best[j][i]: the least cost of lengths[:i] covered by j edges, the last of them lengths[i-1]
    best = np.full((k + 1, g + 1), np.inf)
    back = np.zeros((k + 1, g + 1), dtype=int)
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(1, g + 1):
            for h in range(i):  # the previous edge closed lengths[:h]
                cost = best[j - 1][h] + lengths[i - 1] * (cum[i] - cum[h])
                if cost < best[j][i]:
                    best[j][i], back[j][i] = cost, h
    total = [(best[j][i] + max_len * (tail - cum[i]), j, i) for j in range(1, k + 1) for i in range(1, g + 1)]
    _, j, i = min(total)
    edges = []
    while j:
        edges.append(lengths[i - 1])
        i, j = back[j][i], j - 1
    return tuple(sorted(edges))


def padding_waste(weights: dict[int, float], pad_to: tuple[int, ...] | None) -> float:
    """Padded elements over real ones, expected: 0 without padding."""
    if not pad_to:
        return 0.0
    real = sum(n * w for n, w in weights.items())
    sent = sum(min((e for e in pad_to if e >= n), default=n) * w for n, w in weights.items())
    return sent / real - 1


NO_PADDING = 0  # the count that stands for every length its own shape


def choose(claims: dict[int, float]) -> int:
    """The bucket count to keep from each count's measured claim (req/s within the SLO), NO_PADDING
    among them: the fewest buckets within a tie of the best, and no padding only when it beats
    every count by more than a tie (on a CPU, where a batch costs what its requests cost alone,
    padding buys nothing and costs its waste)."""
    top = max(claims.values())
    padded = [k for k, rate in claims.items() if k != NO_PADDING and rate >= (1 - TIE) * top]
    return min(padded) if padded else NO_PADDING


def padded_rule(rules: list[InputRule]) -> InputRule | None:
    """The input whose length decides a request's bucket: the first that pads and draws lengths."""
    return next((r for r in rules if r.pad_to and r.lengths), None)


def model_edge_sets(spec: Spec, model: str, counts: tuple[int, ...] = COUNTS) -> list[tuple[int, ...]]:
    """`edge_sets` for a spec model, from the input rules its config carries."""
    return edge_sets(input_rules(resolve(spec, spec.model(model))), counts)


def edge_sets(rules: list[InputRule], counts: tuple[int, ...] = COUNTS) -> list[tuple[int, ...]]:
    """For each bucket count, the edges that waste least on the model's length distribution (the
    last bucket pads to the max, so one bucket is `()`); none when no input pads by a distribution."""
    rule = padded_rule(rules)
    if rule is None:
        return []
    weights, top = length_weights(rule), max(rule.pad_to)
    return list(dict.fromkeys(best_edges(weights, k, top) for k in counts))
