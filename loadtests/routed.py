"""Load through the router: the asyncio generator sends via an AsyncRouter, and the result gains a
`router` section with each endpoint's share, outcomes and latency, and Triton's own counts there.

The router's counters and every endpoint's Triton statistics are snapshotted together at the
steady window's start and after the drain (AsyncRouter.statistics), so the section holds that
window's deltas. The result's `server` block sums Triton's statistics over the endpoints that
answered both snapshots (one killed mid-run drops out rather than giving negative deltas).
"""

from __future__ import annotations

import asyncio
import random
import time

import numpy as np

from tritonkit.clients.errors import TritonRequestError
from tritonkit.clients.router import AsyncRouter, RouterPolicy
from tritonkit.loadtests.asyncgen import run_load
from tritonkit.loadtests.load import Load, RequestClass, Sample
from tritonkit.loadtests.results import build_result
from tritonkit.stats import percentile

STAGE_KEYS = ("compute_input", "compute_infer", "compute_output")


def measure_router(urls: list[str], model: str, load: Load, classes: list[RequestClass] | None = None, *,
                   policy: RouterPolicy | None = None, coalesce: bool = False, duplicates: float | None = None,
                   seed: int = 0) -> dict:
    """One load test through a router over `urls` (gRPC HOST:PORT, edge first): the usual result
    plus its `router` section."""
    classes = classes or [RequestClass()]

    async def go():
        async with AsyncRouter(urls, policy, coalesce=coalesce, seed=seed) as router:
            return await run_load(urls[0], model, load, classes, seed=seed, target=router, duplicates=duplicates)

    out = asyncio.run(go())
    before, after = out.stats_before, out.stats_after
    out.stats_before, out.stats_after = merged_stats(before, after)
    result = build_result(model, load, classes, out)
    result["router"] = router_section(before, after, out.samples, coalesce=coalesce, duplicates=duplicates)
    return result


def route_requests(urls: list[str], model: str, requests: int, *, concurrency: int = 1,
                   policy: RouterPolicy | None = None, coalesce: bool = False, duplicates: float | None = None,
                   priority: int = 0, timeout_us: int | None = None, seed: int = 0) -> dict:
    """Send `requests` requests through a router, `concurrency` at a time; the router section."""
    return asyncio.run(_route_requests(urls, model, requests, concurrency, policy, coalesce, duplicates,
                                       priority, timeout_us, seed))


async def _route_requests(urls, model, requests, concurrency, policy, coalesce, duplicates, priority, timeout_us,
                          seed) -> dict:
    rng = random.Random(seed)
    data_rng = np.random.default_rng(seed)
    samples: list[Sample] = []
    async with AsyncRouter(urls, policy, coalesce=coalesce, seed=seed) as router:
        meta = await router.metadata(model)
        before = await router.statistics(model)
        latest = meta.random_inputs(1, data_rng)
        left = requests

        async def worker() -> None:
            nonlocal left, latest
            while left > 0:
                left -= 1
                if duplicates is None or rng.random() >= duplicates:
                    latest = meta.random_inputs(1, data_rng)
                t0 = time.perf_counter()
                try:
                    r = await router.infer_routed(model, latest, priority=priority, timeout_us=timeout_us)
                    samples.append(Sample("route", t0, t0, time.perf_counter() - t0, endpoint=r.endpoint))
                except TritonRequestError as e:
                    samples.append(Sample("route", t0, t0, None, e.kind))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        after = await router.statistics(model)
    return router_section(before, after, samples, coalesce=coalesce, duplicates=duplicates)


def merged_stats(before: dict | None, after: dict | None) -> tuple[dict | None, dict | None]:
    """Triton's statistics summed over the endpoints present in both router snapshots."""
    if not before or not after:
        return None, None
    common = [u for u, s in before["endpoints"].items() if s and after["endpoints"].get(u)]
    if not common:
        return None, None
    return (_sum_stats([before["endpoints"][u] for u in common]),
            _sum_stats([after["endpoints"][u] for u in common]))


def _sum_stats(items: list[dict]) -> dict:
    def add(into: dict, key: str, src: dict) -> None:
        s = src.get(key, {})
        d = into.setdefault(key, {"count": 0, "ns": 0})
        d["count"] += int(s.get("count", 0))
        d["ns"] += int(s.get("ns", 0))

    out: dict = {"inference_count": 0, "execution_count": 0, "inference_stats": {}, "batch_stats": []}
    by_size: dict[int, dict] = {}
    for st in items:
        out["inference_count"] += int(st.get("inference_count", 0))
        out["execution_count"] += int(st.get("execution_count", 0))
        for key in st.get("inference_stats", {}):
            add(out["inference_stats"], key, st["inference_stats"])
        for b in st.get("batch_stats", []):
            row = by_size.setdefault(int(b["batch_size"]), {"batch_size": int(b["batch_size"])})
            for key in STAGE_KEYS:
                add(row, key, b)
    out["batch_stats"] = [by_size[k] for k in sorted(by_size)]
    return out


def router_section(before: dict, after: dict, samples: list[Sample], *, coalesce: bool = False,
                   duplicates: float | None = None) -> dict:
    """Per endpoint: the share of answered requests and their latency (from the samples), the
    router's counters and Triton's inference and cache-hit counts (deltas of the two snapshots)."""
    r0, r1 = before["router"], after["router"]
    answered = [s for s in samples if s.latency_s is not None and s.endpoint]
    endpoints = {}
    for url, c1 in r1["endpoints"].items():
        c0 = r0["endpoints"][url]
        lat_ms = [s.latency_s * 1e3 for s in answered if s.endpoint == url]
        t0, t1 = before["endpoints"].get(url), after["endpoints"].get(url)
        endpoints[url] = {
            "role": c1["role"],
            "answered": len(lat_ms),
            "share": round(len(lat_ms) / len(answered), 4) if answered else 0.0,
            "p50_ms": _round(percentile(lat_ms, 50)) if lat_ms else None,
            "p95_ms": _round(percentile(lat_ms, 95)) if lat_ms else None,
            **{k: c1[k] - c0[k] for k in ("sent", "ok", "failed", "retried_to", "hedged", "explored", "cancelled",
                                           "breaker_trips")},
            "errors": {k: v - c0["errors"].get(k, 0) for k, v in c1["errors"].items() if v - c0["errors"].get(k, 0)},
            "breaker": c1["breaker"], "rtt_ms": c1["rtt_ms"], "service_ms": c1["service_ms"],
            # Triton's own counts; None where the endpoint did not answer a statistics call
            "triton_inferences": _delta(t0, t1, lambda s: int(s.get("inference_count", 0))),
            "cache_hits": _delta(t0, t1, lambda s: int(s.get("inference_stats", {}).get("cache_hit", {})
                                                       .get("count", 0))),
        }
    known = [e["triton_inferences"] for e in endpoints.values() if e["triton_inferences"] is not None]
    co0, co1 = r0.get("coalesce") or {}, r1.get("coalesce") or {}
    co_requests = co1.get("requests", 0) - co0.get("requests", 0)
    co_hits = co1.get("hits", 0) - co0.get("hits", 0)
    return {
        "endpoints": endpoints,
        "requests": len(samples),
        "ok": sum(1 for s in samples if s.latency_s is not None),
        "errors": _kinds(samples),
        "retries": r1["retries"] - r0["retries"],
        "hedges": r1["hedges"] - r0["hedges"],
        "coalesce": {"enabled": coalesce, "requests": co_requests, "hits": co_hits,
                     "hit_rate": round(co_hits / co_requests, 4) if co_requests else 0.0},
        "duplicates": duplicates,
        "triton_inferences": sum(known) if known else None,
    }


def _kinds(samples: list[Sample]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in samples:
        if s.kind:
            out[s.kind] = out.get(s.kind, 0) + 1
    return out


def _round(v: float) -> float:
    return round(v, 3)


def _delta(before: dict | None, after: dict | None, get) -> int | None:
    return get(after) - get(before) if before and after else None
