"""`tritonkit bench buckets`: traffic whose lengths vary, sent three ways to one text-line
recogniser ([3, 48, W], W from 32 to 320 on a stride of 8), for lengths drawn uniform and
log-uniform:

- none: every width its own shape (what a client sends when nothing pads);
- max: every request padded to W = 320 (one shape, the most padding);
- tuned: padded up to edges chosen for the distribution (tuner/buckets.py): the least padding for
  each bucket count, and the count whose measured claim is best.

First the edges are tuned: each candidate count's claim (the highest Poisson rate within the SLO,
benchmarks/claim.py), once. Then, run by run, each way at one Poisson rate (the tuned way's claim
from the tuning), then its own claim. Reported per way: padding waste (padded elements over real
ones, as sent), Triton's mean batch, P95 and errors at that rate, and the claim. The server runs
on half the cores and the generator on the other half.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import yaml

from tritonkit.benchmarks.cases import line_recogniser
from tritonkit.benchmarks.claim import DRAIN_S, claim_rate
from tritonkit.benchmarks.cores import pinned, split_cores
from tritonkit.configs.generate import generate
from tritonkit.configs.loader import load_spec
from tritonkit.files import write_bytes_atomic
from tritonkit.input_rules import InputRule
from tritonkit.loadtests.asyncgen import run_load
from tritonkit.loadtests.load import Load, run_figures
from tritonkit.loadtests.results import SCHEMA
from tritonkit.loadtests.server_stats import breakdown
from tritonkit.serving import running
from tritonkit.stats import medians
from tritonkit.tuner.buckets import NO_PADDING, best_edges, choose, length_weights, padding_waste

DISTS = ("uniform", "loguniform")
LOW, HIGH, STRIDE = 32, 320, 8
COUNTS = (2, 3, 4, 6)  # bucket counts the tuning tries, beside 1 (pad to the max)
SLO_MS = 50.0
LINE = {"name": "line", "dtype": "FP32", "dims": [3, 48, -1], "min": [3, 48, LOW], "opt": [3, 48, 160],
        "max": [3, 48, HIGH], "stride": STRIDE}
BATCHING = {"max_queue_delay_us": 4000, "preferred_batch_sizes": [8, 16]}


def _model(name: str, dist: str, edges: tuple[int, ...] | None) -> dict:
    """`edges` None: no padding; () pads to the max."""
    m = {"name": name, "onnx": "line.onnx", "max_batch_size": 16, "batching": BATCHING,
         "inputs": [{**LINE, "lengths": {"dist": dist, "low": LOW, "high": HIGH}}], "slo": {"p95_ms": SLO_MS}}
    if edges is not None:
        m["padding"] = {"crop": {"logits": {"dim": 0, "per": 4}}}
        m["build"] = {"bucket_edges": list(edges)}
    return m


def _ways(dist: str) -> dict[str, tuple[int, ...] | None]:
    """Every variant served for `dist`: none, k1 (the max), and the candidate counts."""
    weights = length_weights(_rule(dist))
    return {"none": None, "k1": (), **{f"k{k}": best_edges(weights, k, HIGH) for k in COUNTS}}


async def _at_rate(url: str, model: str, rate: float, seconds: float, seed: int) -> dict:
    load = Load(rate=rate, duration_s=seconds, warmup_s=1.0, drain_s=DRAIN_S)
    out = await run_load(url, model, load, seed=seed)
    f = run_figures(load, out)
    server = breakdown(out.stats_before, out.stats_after) if out.stats_before and out.stats_after else {}
    return {"rate": round(rate, 1), "p95_ms": f.p95_ms and round(f.p95_ms, 2), "error_ratio": round(f.error_ratio, 4),
            "mean_batch": server.get("mean_batch") and round(server["mean_batch"], 2),
            "padding_waste": out.padding_waste,
            "generator_limited": f.saturated}


async def _bench_dist(url: str, dist: str, ways: dict, seconds: float, runs: int, log: Callable[[str], None]) -> dict:
    log(f"== {dist} lengths {LOW}..{HIGH}: tuning the bucket count")
    tuning = {}
    for name in ["none", "k1", *(f"k{k}" for k in COUNTS)]:
        log(f"  {name}: " + ("no padding" if name == "none" else f"edges {list(ways[name]) or '-'} + {HIGH}"))
        tuning[name] = await claim_rate(url, f"line_{dist}_{name}", SLO_MS, seconds, log, steps=5)
    claims = {NO_PADDING if name == "none" else int(name[1:]): t["claim_rps"] for name, t in tuning.items()}
    weights = length_weights(_rule(dist))
    k = choose(claims)
    tuned = "none" if k == NO_PADDING else f"k{k}"
    rate = tuning[tuned]["claim_rps"]
    chosen = "no padding" if ways[tuned] is None else f"{k} bucket(s), edges {list(ways[tuned]) or '-'} + {HIGH}"
    log(f"  tuned: {chosen}; every way at {rate:.0f} req/s")
    table: dict[str, list[dict]] = {"none": [], "max": [], "tuned": []}
    for run in range(runs):
        for way, name in (("none", "none"), ("max", "k1"), ("tuned", tuned)):
            model = f"line_{dist}_{name}"
            row = await _at_rate(url, model, rate, seconds, seed=run)
            row["claim_rps"] = (await claim_rate(url, model, SLO_MS, seconds, lambda s: None, steps=5))["claim_rps"]
            table[way].append(row)
            log(f"  run {run + 1} {way:<6} waste {row['padding_waste']}  mean batch {row['mean_batch']}  "
                f"P95 {row['p95_ms']} ms  errors {row['error_ratio']:.1%}  claim {row['claim_rps']:.0f} req/s"
                f"{'  (generator-limited)' if row['generator_limited'] else ''}")
    return {"tuning": {n: {"edges": None if ways[n] is None else list(ways[n]), "claim_rps": t["claim_rps"]}
                       for n, t in tuning.items()},
            "tuned_buckets": k, "tuned_edges": None if ways[tuned] is None else list(ways[tuned]), "rate": rate,
            "expected_waste": {way: round(padding_waste(weights, None if ways[name] is None else
                                                        tuple(sorted({*ways[name], HIGH}))), 3)
                               for way, name in (("max", "k1"), ("tuned", tuned))},
            "ways": table, "summary": {way: _median(rows) for way, rows in table.items()}}


def _rule(dist: str) -> InputRule:
    return InputRule("line", "FP32", (3, 48, -1), min=(3, 48, LOW), max=(3, 48, HIGH), stride=STRIDE,
                     lengths=(dist, LOW, HIGH))


def _median(rows: list[dict]) -> dict:
    return medians(rows, ("padding_waste", "mean_batch", "p95_ms", "claim_rps"))


def format_table(dist: str, res: dict) -> list[str]:
    def span(fig, fmt="{:.2f}") -> str:
        if fig is None:
            return "-"
        return f"{fmt.format(fig['median'])} ({fmt.format(fig['min'])}-{fmt.format(fig['max'])})"

    edges = res["tuned_edges"]
    tuned = "no padding" if edges is None else f"{res['tuned_buckets']} bucket(s) {edges} + {HIGH}"
    lines = [f"{dist}: tuned {tuned}; all at "
             f"{res['rate']:.0f} req/s; SLO P95 {SLO_MS:g} ms",
             f"  {'way':<6} {'padding waste':<20} {'mean batch':<20} {'P95 ms':<22} claim req/s"]
    for way, m in res["summary"].items():
        lines.append(f"  {way:<6} {span(m['padding_waste']):<20} {span(m['mean_batch']):<20} "
                     f"{span(m['p95_ms'], '{:.1f}'):<22} {span(m['claim_rps'], '{:.0f}')}")
    return lines


def run_buckets_bench(out_dir: Path, state_dir: Path, *, seconds: float = 3.0, runs: int = 3,
                      log: Callable[[str], None] = print) -> dict:
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    line_recogniser(folder / "line.onnx")
    ways = {dist: _ways(dist) for dist in DISTS}
    models = [_model(f"line_{dist}_{name}", dist, edges) for dist in DISTS for name, edges in ways[dist].items()]
    spec_path = folder / "deploy.yaml"
    spec_path.write_text(yaml.safe_dump({"models": models, "server": {"http_port": 0, "grpc_port": 0,
                                                                       "metrics_port": 0}}, sort_keys=False))
    generate(load_spec(spec_path, folder / "repo"), folder / "repo")
    server_cpus, generator_cpus = split_cores()
    result = {"schema": SCHEMA, "kind": "bench/buckets", "slo_p95_ms": SLO_MS, "lengths": [LOW, HIGH, STRIDE],
              "runs": runs, "server_cpus": sorted(server_cpus or []), "generator_cpus": sorted(generator_cpus or []),
              "dists": {}}
    with running(load_spec(spec_path), folder / "repo", state_dir, log=log, cpus=server_cpus) as r, \
            pinned(generator_cpus):
        for dist in DISTS:
            result["dists"][dist] = asyncio.run(_bench_dist(r.endpoints.grpc, dist, ways[dist], seconds, runs, log))
    for dist, res in result["dists"].items():
        for line in format_table(dist, res):
            log(line)
    write_bytes_atomic(folder / "bench_buckets.json", json.dumps(result, indent=2).encode())
    return result
