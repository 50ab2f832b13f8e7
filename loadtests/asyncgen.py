"""A minimal asyncio gRPC load generator: open loop at a target rate, or closed loop at a concurrency.

Open loop means arrivals follow a schedule (Poisson or constant) whatever the server does, so a
slow server shows up as latency, not as a lower offered load. Each request keeps its scheduled
and actual send times; their difference is the generator's own lag, which is how it tells that
it, not the server, is the bottleneck. Only requests scheduled inside the steady window count.
What a load is (classes, arrival, shape, window) is defined in `load.py`, shared with Locust.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from pathlib import Path

import psutil

from tritonkit.clients import AsyncClient, TritonRequestError
from tritonkit.configs.gateway import CLASS_HEADER
from tritonkit.loadtests.load import Load, Outcome, RequestClass, Sample
from tritonkit.loadtests.stalls import watch


async def _statistics(client, model: str) -> dict | None:
    """Triton's statistics, or None where they cannot be had: behind a gateway under overload the
    call itself may be refused, and the load's own figures stand without them."""
    try:
        return await client.statistics(model)
    except TritonRequestError:
        return None


async def run_load(url: str, model: str, load: Load, classes: list[RequestClass] | None = None, *,
                   protocol: str = "grpc", seed: int = 0, target=None, duplicates: float | None = None,
                   input_data: Path | None = None) -> Outcome:
    """Send `load` to `model` at `url`; the steady window's samples and Triton's statistics around it.

    `target`: an open client-like object to send through instead (an AsyncRouter: its samples then
    name the endpoint that answered). Inputs come from the model's sampler (tritonkit/inputs.py):
    `input_data` is real request data to cycle through; without it, generated data by the model's
    rules. `duplicates`: None sends one fixed generated payload per class (fresh ones where the
    rules vary the shape); a share d in [0, 1) repeats the class's latest payload and the other
    requests carry fresh inputs.
    """
    classes = classes or [RequestClass()]
    rng = random.Random(seed)
    out = Outcome()
    proc = psutil.Process()
    cpu0 = sum(proc.cpu_times()[:2])
    async with contextlib.nullcontext(target) if target is not None else AsyncClient(url, protocol) as client:
        meta = await client.metadata(model)
        sampler = meta.sampler(input_data, seed)
        payloads = {c.name: sampler(c.batch) for c in classes}
        headers = {c.name: {CLASS_HEADER: c.name} for c in classes}  # a gateway routes on the class
        fresh = duplicates is None and sampler.varies
        send = getattr(client, "infer_routed", client.infer)  # a router also says where it was answered

        def payload(cls: RequestClass) -> dict:
            if fresh or (duplicates is not None and rng.random() >= duplicates):
                payloads[cls.name] = sampler(cls.batch)
            return payloads[cls.name]

        start = time.perf_counter()
        window = (start + load.warmup_s, start + load.warmup_s + load.duration_s)
        counting = [True]  # False once the drain is over: a straggler's answer then comes too late to count

        async def open_window() -> None:
            await asyncio.sleep(load.warmup_s)
            out.stats_before = await _statistics(client, model)

        opener = asyncio.create_task(open_window())
        watcher = asyncio.create_task(watch(out.stalls))

        async def one(cls: RequestClass, scheduled: float) -> None:
            arrays = payload(cls)
            sent = time.perf_counter()
            try:
                r = await send(model, arrays, priority=cls.priority, timeout_us=cls.timeout_us,
                               headers=headers[cls.name])
                sample = Sample(cls.name, scheduled, sent, time.perf_counter() - sent,
                                endpoint=getattr(r, "endpoint", None))
            except TritonRequestError as e:
                sample = Sample(cls.name, scheduled, sent, None, e.kind, failed_after_s=time.perf_counter() - sent)
                out.error_examples.setdefault(e.kind, str(e)[:200])
            if counting[0] and window[0] <= scheduled < window[1]:
                out.samples.append(sample)

        def pick() -> RequestClass:
            return rng.choices(classes, weights=[c.weight for c in classes])[0]

        if load.rate:
            tasks: set[asyncio.Task] = set()
            sent_in_window = 0
            t = start
            while True:
                rate = load.rate_at(t - start)
                t += rng.expovariate(rate) if load.arrival == "poisson" else 1.0 / rate
                if t >= window[1]:
                    break
                delay = t - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if len(tasks) >= load.max_in_flight:
                    out.dropped += window[0] <= t
                    continue
                sent_in_window += window[0] <= t
                task = asyncio.create_task(one(pick(), t))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks, timeout=load.drain_s)
            # Still out after the drain: counted as unanswered and no longer sampled, but not
            # cancelled: a Triton before 2.54 may crash on a cancelled request (support.cancels_safely)
            counting[0] = False
            out.unanswered = sent_in_window - len(out.samples)  # only the window's are sampled
        else:
            async def worker(i: int) -> None:
                while (now := time.perf_counter()) < window[1]:
                    if i < load.clients_at(now - start):
                        await one(pick(), now)
                    else:  # the shape has this client idle for now
                        await asyncio.sleep(0.05)

            await asyncio.gather(*(worker(i) for i in range(load.concurrency)))
        await opener
        watcher.cancel()
        out.stats_after = await _statistics(client, model)
        out.real_elements, out.sent_elements = sampler.real_elements, sampler.sent_elements
        out.wall_s = time.perf_counter() - start
    out.cpu_percent = 100.0 * (sum(proc.cpu_times()[:2]) - cpu0) / out.wall_s
    return out
