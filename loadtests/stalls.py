"""The load generator's own stalls, and latencies with them taken out.

On a shared machine the generator's event loop sometimes does not run for tens of ms (the OS
gave both cores to someone else, or the loop was busy). A response that arrives then waits for
the loop, and the client counts the wait as latency although Triton had answered. A watcher
that should wake every TICK_S records each late wake-up as a stall.

Only a request seen done right after a stall ended (within SEEN_S: the loop works off what
queued up) may have waited for it; its answer came somewhere inside the part of the stall it was
in flight for, and half of that part, the expected wait, is taken out. A request seen done later
was still at the server when the stall ended: nothing is taken out of its latency.
"""

from __future__ import annotations

import asyncio
import bisect
import time

TICK_S = 0.005
LATE_S = 0.005  # a wake-up later than this is a stall (ordinary scheduling jitter is below it)
SEEN_S = 0.010  # after a stall, the loop handles what queued up within this


async def watch(stalls: list[tuple[float, float]]) -> None:
    """Append (start, end) perf_counter intervals in which the loop did not run; until cancelled."""
    last = time.perf_counter()
    while True:
        await asyncio.sleep(TICK_S)
        now = time.perf_counter()
        if now - last > TICK_S + LATE_S:
            stalls.append((last + TICK_S, now))
        last = now


def waited_s(sent: float, done: float, stalls: list[tuple[float, float]]) -> float:
    """The expected time a request sent at `sent` and seen done at `done` waited for the generator:
    half its overlap with the stall that ended just before `done`, if one did (stalls sorted)."""
    i = bisect.bisect_right(stalls, (done, done)) - 1
    if i < 0:
        return 0.0
    a, b = stalls[i]
    if not (b <= done <= b + SEEN_S or a <= done < b):
        return 0.0
    return max(0.0, min(b, done) - max(a, sent)) / 2


def without_stalls(samples, stalls: list[tuple[float, float]]) -> list[float]:
    """Latencies (s) of the successful samples, each less its expected wait for the generator."""
    return [s.latency_s - waited_s(s.sent, s.sent + s.latency_s, stalls) if stalls else s.latency_s
            for s in samples if s.latency_s is not None]
