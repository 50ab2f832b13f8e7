"""A minimal asyncio gRPC load generator: open loop at a target rate, or closed loop at a concurrency.

Open loop means arrivals follow a schedule (Poisson or constant) whatever the server does, so a
slow server shows up as latency, not as a lower offered load. Each request keeps its scheduled
and actual send times; their difference is the generator's own lag, which is how it tells that
it, not the server, is the bottleneck. Only requests scheduled inside the steady window count.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import numpy as np
import psutil

from tritonkit.clients import AsyncClient, TritonRequestError
from tritonkit.stats import percentile


@dataclass(frozen=True)
class RequestClass:
    name: str = "default"
    weight: float = 1.0
    priority: int = 0
    timeout_us: int | None = None
    batch: int = 1


@dataclass(frozen=True)
class Load:
    rate: float | None = None  # open loop, requests per second
    arrival: str = "poisson"  # poisson | constant
    concurrency: int | None = None  # closed loop
    duration_s: float = 10.0  # steady window
    warmup_s: float = 2.0
    drain_s: float = 10.0
    max_in_flight: int = 2048  # beyond this the generator drops arrivals (and says so)

    @property
    def mode(self) -> str:
        return "open" if self.rate else "closed"

    def describe(self) -> str:
        if self.rate:
            return f"open loop, {self.arrival} arrivals at {self.rate:g} req/s"
        return f"closed loop, {self.concurrency} concurrent clients"


@dataclass
class Sample:
    cls: str
    scheduled: float
    sent: float
    latency_s: float | None  # None when the request failed
    kind: str | None = None  # error kind when it failed


@dataclass
class Outcome:
    samples: list[Sample] = field(default_factory=list)  # steady window only
    dropped: int = 0  # arrivals the generator could not send (max_in_flight reached)
    cpu_percent: float = 0.0  # this process's CPU over the run, percent of one core
    wall_s: float = 0.0
    error_examples: dict[str, str] = field(default_factory=dict)


async def run_load(url: str, model: str, load: Load, classes: list[RequestClass] | None = None, *,
                   protocol: str = "grpc", seed: int = 0) -> Outcome:
    if not load.rate and not load.concurrency:
        raise ValueError("give a rate (open loop) or a concurrency (closed loop)")
    classes = classes or [RequestClass()]
    rng = random.Random(seed)
    out = Outcome()
    proc = psutil.Process()
    cpu0 = sum(proc.cpu_times()[:2])
    async with AsyncClient(url, protocol) as client:
        meta = await client.metadata(model)
        payloads = {c.name: meta.random_inputs(c.batch, np.random.default_rng(seed)) for c in classes}
        start = time.perf_counter()
        window = (start + load.warmup_s, start + load.warmup_s + load.duration_s)

        async def one(cls: RequestClass, scheduled: float) -> None:
            sent = time.perf_counter()
            try:
                await client.infer(model, payloads[cls.name], priority=cls.priority, timeout_us=cls.timeout_us)
                sample = Sample(cls.name, scheduled, sent, time.perf_counter() - sent)
            except TritonRequestError as e:
                sample = Sample(cls.name, scheduled, sent, None, e.kind)
                out.error_examples.setdefault(e.kind, str(e)[:200])
            if window[0] <= scheduled < window[1]:
                out.samples.append(sample)

        def pick() -> RequestClass:
            return rng.choices(classes, weights=[c.weight for c in classes])[0]

        if load.rate:
            tasks: set[asyncio.Task] = set()
            t = start
            while True:
                t += rng.expovariate(load.rate) if load.arrival == "poisson" else 1.0 / load.rate
                if t >= window[1]:
                    break
                delay = t - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if len(tasks) >= load.max_in_flight:
                    out.dropped += window[0] <= t
                    continue
                task = asyncio.create_task(one(pick(), t))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks, timeout=load.drain_s)
        else:
            async def worker() -> None:
                while (now := time.perf_counter()) < window[1]:
                    await one(pick(), now)

            await asyncio.gather(*(worker() for _ in range(load.concurrency)))
        out.wall_s = time.perf_counter() - start
    out.cpu_percent = 100.0 * (sum(proc.cpu_times()[:2]) - cpu0) / out.wall_s
    return out


def generator_health(load: Load, out: Outcome) -> dict:
    """Is the generator keeping up? Lag behind the schedule, achieved rate, CPU, dropped arrivals."""
    lags_ms = [(s.sent - s.scheduled) * 1e3 for s in out.samples]
    achieved = len(out.samples) / load.duration_s
    health = {"cpu_percent": round(out.cpu_percent, 1), "achieved_rate": round(achieved, 1),
              "lag_p95_ms": round(percentile(lags_ms, 95), 3) if lags_ms else None,
              "dropped": out.dropped, "saturated": False, "warning": None}
    reasons = []
    if out.cpu_percent > 90:
        reasons.append(f"its process used {out.cpu_percent:.0f}% of a core")
    if load.rate:
        if achieved < 0.9 * load.rate:
            reasons.append(f"it sent {achieved:.0f} req/s of the {load.rate:g} asked")
        if health["lag_p95_ms"] is not None and health["lag_p95_ms"] > max(5.0, 500.0 / load.rate):
            reasons.append(f"its sends ran {health['lag_p95_ms']:.1f} ms (P95) behind schedule")
        if out.dropped:
            reasons.append(f"{out.dropped} arrivals were dropped at {load.max_in_flight} in flight")
    if reasons:
        health["saturated"] = True
        health["warning"] = ("the load generator, not the server, limited this run: " + "; ".join(reasons)
                             + ". Its numbers understate the offered load; use fewer req/s or more generator cores.")
    return health
