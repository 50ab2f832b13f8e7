"""The server's side of a measurement, from Triton itself: statistics deltas and summary metrics.

Triton's statistics API gives cumulative counts and nanoseconds per stage; the difference of two
snapshots taken around a run is exactly that run's work. Divided by the request count it gives the
mean time a request spent queued, copying inputs, inferring and copying outputs.
"""

from __future__ import annotations

import re
import urllib.request

from tritonkit.stats import batch_histogram

STAGES = ("queue", "compute_input", "compute_infer", "compute_output")


def _count_ns(stats: dict, key: str) -> tuple[int, int]:
    s = stats.get("inference_stats", {}).get(key, {})
    return int(s.get("count", 0)), int(s.get("ns", 0))


def breakdown(before: dict, after: dict) -> dict:
    """Mean ms per successful request for each stage, the server-side request latency, the
    batch-size histogram and the cache hits, between two statistics snapshots of one model."""
    n0, ns0 = _count_ns(before, "success")
    n1, ns1 = _count_ns(after, "success")
    requests = n1 - n0
    out: dict = {"requests": requests, "failed": _count_ns(after, "fail")[0] - _count_ns(before, "fail")[0]}
    out["request_ms"] = (ns1 - ns0) / requests / 1e6 if requests else None
    for stage in STAGES:
        c0, s0 = _count_ns(before, stage)
        c1, s1 = _count_ns(after, stage)
        out[f"{stage}_ms"] = (s1 - s0) / requests / 1e6 if requests else None
    out["cache_hits"] = _count_ns(after, "cache_hit")[0] - _count_ns(before, "cache_hit")[0]
    out["batch_histogram"] = batch_histogram(before, after)
    executions = sum(out["batch_histogram"].values())
    out["mean_batch"] = (sum(k * v for k, v in out["batch_histogram"].items()) / executions) if executions else None
    return out


_SUMMARY = re.compile(r'^(nv_inference_\w+_summary_us)\{([^}]*)\}\s+([0-9.eE+-]+|NaN)$')


def summary_quantiles(metrics_url: str, model: str, timeout: float = 5.0) -> dict[str, dict[str, float]]:
    """Triton's summary latency quantiles (µs) for a model, from /metrics. Present when the server
    runs with --metrics-config summary_latencies=true, as the kit's local server does."""
    with urllib.request.urlopen(metrics_url, timeout=timeout) as r:
        text = r.read().decode()
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        m = _SUMMARY.match(line)
        if not m:
            continue
        labels = dict(kv.split("=", 1) for kv in m.group(2).split(","))
        if labels.get("model", "").strip('"') != model or "quantile" not in labels:
            continue
        name = m.group(1).removeprefix("nv_inference_").removesuffix("_summary_us")
        out.setdefault(name, {})[labels["quantile"].strip('"')] = float(m.group(3))
    return out
