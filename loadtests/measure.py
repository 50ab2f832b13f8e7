"""One measurement against a running server, by any engine, in the one result schema."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tritonkit.clients import Client
from tritonkit.loadtests.asyncgen import run_load
from tritonkit.loadtests.load import Load, Outcome, RequestClass
from tritonkit.loadtests.locust_run import run_locust
from tritonkit.loadtests.pa_run import PerfAnalyzerLostExport, PerfAnalyzerStopped, run_pa
from tritonkit.loadtests.results import build_result
from tritonkit.loadtests.server_stats import breakdown, summary_quantiles
from tritonkit.support import cancels_safely


def measure(endpoints, model: str, load: Load, classes: list[RequestClass] | None = None, *,
            seed: int = 0, input_data: Path | None = None) -> dict:
    """One measurement with the asyncio gRPC generator against a running server's `endpoints`."""
    return measure_grpc(endpoints.grpc, model, load, classes, metrics=endpoints.metrics, seed=seed,
                        input_data=input_data)


def measure_grpc(url: str, model: str, load: Load, classes: list[RequestClass] | None = None, *,
                 metrics: str | None = None, seed: int = 0, input_data: Path | None = None) -> dict:
    """Statistics at the window's edges, the asyncio generator's load in between."""
    classes = classes or [RequestClass()]
    out = asyncio.run(run_load(url, model, load, classes, seed=seed, input_data=input_data))
    return build_result(model, load, classes, out, _quantiles(metrics, model))


def measure_by(engine: str, model: str, load: Load, classes: list[RequestClass] | None, *, url: str,
               metrics: str | None = None, log_dir: Path | None = None, input_data: Path | None = None,
               steps: list[str] | None = None, shared_memory: bool = False) -> dict:
    """One measurement by the chosen engine at `url` (HOST:PORT): Locust over HTTP, asyncio or
    perf_analyzer over gRPC. Each takes the model's inputs from the rules its config carries, or
    from `input_data`. `steps`: the models of a pipeline, whose queue and compute Triton's
    statistics give per step (`result["steps"]`). `shared_memory`: perf_analyzer's tensors through
    system shared memory (a server on this machine), as the tuner's trials send them."""
    classes = classes or [RequestClass()]
    protocol = "http" if engine == "locust" else "grpc"
    before = step_statistics(url, protocol, steps) if steps else {}
    if engine == "asyncio":
        result = measure_grpc(url, model, load, classes, metrics=metrics, input_data=input_data)
    elif engine == "perf_analyzer":
        out = run_pa(url, model, load, classes, input_data=input_data, shared_memory=shared_memory)
        result = build_result(model, load, classes, out, _quantiles(metrics, model), engine="perf_analyzer")
    else:
        result = run_locust(url, model, load, classes, input_data=input_data,
                            log_path=log_dir and Path(log_dir) / "locust.log")
        result["server_summary_us"] = _quantiles(metrics, model)
    if steps:
        after = step_statistics(url, protocol, steps)
        result["steps"] = [step_breakdown(s, before[s], after[s]) for s in steps]
    return result


def step_statistics(url: str, protocol: str, steps: list[str]) -> dict[str, dict]:
    with Client(url, protocol) as c:
        return {s: c.statistics(s) for s in steps}


def step_breakdown(model: str, before: dict, after: dict) -> dict:
    """One pipeline step over the whole run (warm-up and drain included: the engines window only
    the pipeline's own statistics): requests, and mean queue and compute ms per request."""
    b = breakdown(before, after)
    compute = [b[f"{s}_ms"] for s in ("compute_input", "compute_infer", "compute_output")]
    return {"model": model, "requests": b["requests"], "failed": b["failed"],
            "queue_ms": None if b["queue_ms"] is None else round(b["queue_ms"], 3),
            "compute_ms": None if None in compute else round(sum(compute), 3),
            "mean_batch": None if b["mean_batch"] is None else round(b["mean_batch"], 2)}


def send_cheapest(url: str, model: str, load: Load, classes: list[RequestClass] | None = None, *,
                  input_data: Path | None = None) -> tuple[Outcome, str]:
    """The load by the kit's cheapest client on this machine: perf_analyzer (shared memory), or the
    asyncio client where perf_analyzer cannot send it (several classes), gives up on it (a refused
    request: asyncio counts every refusal) or loses its export. Returns the outcome and the client that measured it."""
    classes = classes or [RequestClass()]
    if classes == [RequestClass()] and not _abandons_requests(url, model):
        try:
            return run_pa(url, model, load, classes, input_data=input_data, shared_memory=True,
                          log=lambda s: None), "perf_analyzer"
        except (PerfAnalyzerStopped, PerfAnalyzerLostExport):
            pass
    return asyncio.run(run_load(url, model, load, classes, input_data=input_data)), "asyncio"


def _abandons_requests(url: str, model: str) -> bool:
    """Would perf_analyzer leave requests in flight on a server that cannot take it? PA exits at
    its first refused request (a bounded queue's), and its closing connection cancels every request
    still out; Triton before 2.54 can crash on a cancelled request (`support.cancels_safely`; a
    judge run against a one-deep queue lost its server so). Such a load goes to the asyncio client."""
    with Client(url) as c:
        if cancels_safely(c.server_version()):
            return False
        b = c.config(model).dynamic_batching
    policies = [b.default_queue_policy, *b.priority_queue_policy.values()]
    return any(q.max_queue_size for q in policies)


def _quantiles(metrics: str | None, model: str) -> dict:
    if not metrics:
        return {}
    try:
        return summary_quantiles(metrics, model)
    except OSError:
        return {}
