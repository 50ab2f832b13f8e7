"""Single-flight: identical requests in flight at the same time share one inference.

Two requests are identical when model, priority, requested outputs and every input's name, dtype,
shape and bytes agree. The first one (the leader) runs; the others wait for its answer. The
shared run is a task of its own, so a caller that gives up (its deadline passed) never cancels
the answer the others are waiting for. Triton's response cache is the server-side counterpart: it
catches repeats that do not overlap in time.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

import numpy as np

T = TypeVar("T")


def request_key(model: str, arrays: dict[str, np.ndarray], priority: int = 0,
                outputs: list[str] | None = None) -> bytes:
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{model}\0{priority}\0{','.join(outputs or [])}\0".encode())
    for name in sorted(arrays):
        a = np.asarray(arrays[name])
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        if a.dtype == np.object_:  # BYTES tensors: the elements, each with its length
            for item in a.reshape(-1):
                b = item if isinstance(item, bytes) else str(item).encode()
                h.update(len(b).to_bytes(8, "little") + b)
        else:
            h.update(np.ascontiguousarray(a).tobytes())
    return h.digest()


class SingleFlight:
    def __init__(self) -> None:
        self._inflight: dict[bytes, asyncio.Task] = {}
        self.requests = 0
        self.hits = 0  # requests answered by another request's inference

    @property
    def hit_rate(self) -> float:
        return self.hits / self.requests if self.requests else 0.0

    async def run(self, key: bytes, call: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """The result of `call()`, or of the identical call already in flight; and whether shared."""
        self.requests += 1
        task = self._inflight.get(key)
        shared = task is not None
        if shared:
            self.hits += 1
        else:
            task = asyncio.ensure_future(call())
            self._inflight[key] = task
            task.add_done_callback(lambda t: self._done(key, t))
        # shield: cancelling this caller (its own deadline) leaves the shared run to the others
        return await asyncio.shield(task), shared

    def _done(self, key: bytes, task: asyncio.Task) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved here too: every waiter may have given up before the end

    def counters(self) -> dict:
        return {"requests": self.requests, "hits": self.hits, "hit_rate": round(self.hit_rate, 4)}
