"""A closed-loop burst: N requests from C concurrent asyncio workers, every latency recorded.

Small on purpose: the demo and the tests use it to put real concurrent load on a server. The
Locust load tests (loadtests/) are the full tool with arrival schedules and request classes.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from tritonkit.clients.client import AsyncClient
from tritonkit.clients.errors import TritonRequestError


@dataclass
class BurstResult:
    sent: int = 0
    ok: int = 0
    latencies_s: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)  # kind -> count
    examples: dict[str, str] = field(default_factory=dict)  # kind -> first message seen
    wall_s: float = 0.0

    @property
    def throughput(self) -> float:
        return self.ok / self.wall_s if self.wall_s else 0.0


async def burst(url: str, model: str, requests: int, concurrency: int, *, protocol: str = "grpc",
                batch: int = 1, priority: int = 0, timeout_us: int | None = None, seed: int = 0,
                stop: asyncio.Event | None = None) -> BurstResult:
    """Send `requests` requests (or until `stop` is set) and count every outcome."""
    result = BurstResult()
    async with AsyncClient(url, protocol) as client:
        meta = await client.metadata(model)
        payload = meta.random_inputs(batch, np.random.default_rng(seed))
        remaining = iter(range(requests))

        async def worker() -> None:
            for _ in remaining:
                if stop is not None and stop.is_set():
                    return
                result.sent += 1
                t0 = time.perf_counter()
                try:
                    await client.infer(model, payload, priority=priority, timeout_us=timeout_us)
                except TritonRequestError as e:
                    result.errors[e.kind] += 1
                    result.examples.setdefault(e.kind, str(e))
                    continue
                result.latencies_s.append(time.perf_counter() - t0)
                result.ok += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.wall_s = time.perf_counter() - t0
    return result
