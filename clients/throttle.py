"""Client-side adaptive throttling, as Google's SRE book describes it (chapter "Handling Overload").

Each client keeps, over a trailing window, how many requests it wanted to send and how many the
backend accepted, and refuses a new request itself with probability

    max(0, (requests - K * accepts) / (requests + 1))

While the backend accepts everything the probability is zero. When it starts turning requests
away (or, here, answering them after their deadline, which is no better), the client sends about
K times what gets accepted and refuses the rest without a round trip: the refusal costs nothing on
the server's cores. K trades wasted work on the server (high K) against refusing requests the
server could have taken (K near 1). `requests` counts the ones refused locally too, so a client
that refused everything recovers as accepts come back.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable

from tritonkit.clients.errors import ThrottledError, TritonRequestError


class AdaptiveThrottle:
    """The SRE formula over the last `window_s` seconds; `clock` and `rng` injectable for tests."""

    def __init__(self, k: float = 2.0, window_s: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None):
        if k < 1:
            raise ValueError("K below 1 refuses requests the backend accepts")
        self.k, self.window_s, self.clock = k, window_s, clock
        self.rng = rng or random.Random(0)
        self._events: deque[tuple[float, bool]] = deque()  # (when, accepted) per request wanted
        self.requests = self.accepts = 0  # within the window
        self.refused = 0  # all refused locally, for the report

    def _expire(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self.window_s:
            _, accepted = self._events.popleft()
            self.requests -= 1
            self.accepts -= accepted

    def reject_probability(self) -> float:
        self._expire(self.clock())
        return max(0.0, (self.requests - self.k * self.accepts) / (self.requests + 1))

    def admit(self) -> bool:
        """Whether to send the next request; a refused one counts as a request not accepted."""
        if self.rng.random() < self.reject_probability():
            self._record(False)
            self.refused += 1
            return False
        return True

    def _record(self, accepted: bool) -> None:
        self._events.append((self.clock(), accepted))
        self.requests += 1
        self.accepts += accepted

    def done(self, accepted: bool) -> None:
        """The outcome of a request `admit` let through."""
        self._expire(self.clock())
        self._record(accepted)


class ThrottledClient:
    """An async client (AsyncClient, AsyncRouter) behind an AdaptiveThrottle: a request is accepted
    when it is answered within `deadline_s`. With `send_deadline` that is also the gRPC deadline it
    is sent with; off by default, because a Triton that cancels the request then may crash on it
    (`support.cancels_safely` says which do not). A refused request raises ThrottledError at once,
    without leaving the process."""

    def __init__(self, client, throttle: AdaptiveThrottle, deadline_s: float, send_deadline: bool = False):
        self.client, self.throttle, self.deadline_s = client, throttle, deadline_s
        self.send_deadline = send_deadline

    async def infer(self, model: str, arrays, **kw):
        if not self.throttle.admit():
            raise ThrottledError(f"throttled by the client (K={self.throttle.k:g}: the backend accepted "
                                 f"{self.throttle.accepts} of the last {self.throttle.requests} requests)")
        sent = time.monotonic()
        try:
            if self.send_deadline:
                kw["deadline_s"] = self.deadline_s
            out = await self.client.infer(model, arrays, **kw)
        except TritonRequestError:
            self.throttle.done(False)
            raise
        self.throttle.done(time.monotonic() - sent <= self.deadline_s)
        return out

    async def metadata(self, model: str):
        return await self.client.metadata(model)

    async def statistics(self, model: str) -> dict:
        return await self.client.statistics(model)
