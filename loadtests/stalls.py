"""The load generator's own stalls, and latencies with them taken out.

On a shared machine the generator's event loop sometimes does not run for tens of ms (the OS
gave both cores to someone else, or the loop was busy). A response that arrives then waits for
the loop, and the client counts the wait as latency although Triton had answered. A watcher
that should wake every TICK_S records each late wake-up as a stall; a request's latency less the
stalls inside it is Triton's latency plus the client's ordinary overhead (issue #15).
"""

from __future__ import annotations

import asyncio
import bisect
import time

TICK_S = 0.005
LATE_S = 0.005  # a wake-up later than this is a stall (ordinary scheduling jitter is below it)


async def watch(stalls: list[tuple[float, float]]) -> None:
    """Append (start, end) perf_counter intervals in which the loop did not run; until cancelled."""
    last = time.perf_counter()
    while True:
        await asyncio.sleep(TICK_S)
        now = time.perf_counter()
        if now - last > TICK_S + LATE_S:
            stalls.append((last + TICK_S, now))
        last = now


def stalled_s(start: float, end: float, stalls: list[tuple[float, float]]) -> float:
    """Seconds of `stalls` (sorted, disjoint) inside [start, end]."""
    i = max(0, bisect.bisect_left(stalls, (start,)) - 1)
    total = 0.0
    for a, b in stalls[i:]:
        if a >= end:
            break
        total += max(0.0, min(b, end) - max(a, start))
    return total


def without_stalls(samples, stalls: list[tuple[float, float]]) -> list[float]:
    """Latencies (s) of the successful samples, each less the generator's stalls while it was in flight."""
    out = []
    for s in samples:
        if s.latency_s is not None:
            out.append(max(0.0, s.latency_s - stalled_s(s.sent, s.sent + s.latency_s, stalls)) if stalls
                       else s.latency_s)
    return out
