"""A circuit breaker per endpoint: stop sending where requests keep failing, and try it again with one request.

closed ──N consecutive failures──► open ──cool-down over──► half-open ──try ok──► closed
                                     ▲                          │
                                     └──────try failed──────────┘

Half-open lets exactly one request through at a time (the try); the others go elsewhere. The
clock is injectable so the state machine can be checked without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class CircuitBreaker:
    def __init__(self, failures: int = 5, cooldown_s: float = 2.0, clock: Callable[[], float] = time.monotonic):
        if failures < 1 or cooldown_s < 0:
            raise ValueError("failures must be >= 1 and cooldown_s >= 0")
        self.failures = failures
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._state = CLOSED
        self._consecutive = 0
        self._opened_at = 0.0
        self._probing = False
        self.trips = 0  # times it opened: how often the endpoint was taken out

    @property
    def state(self) -> str:
        if self._state == OPEN and self._clock() - self._opened_at >= self.cooldown_s:
            self._state = HALF_OPEN
            self._probing = False
        return self._state

    def available(self) -> bool:
        """Could a request go here now? (Does not claim the half-open try.)"""
        state = self.state
        return state == CLOSED or (state == HALF_OPEN and not self._probing)

    def acquire(self) -> bool:
        """Claim permission to send one request; in half-open that request is the try."""
        if not self.available():
            return False
        if self._state == HALF_OPEN:
            self._probing = True
        return True

    def success(self) -> None:
        self._consecutive = 0
        self._probing = False
        self._state = CLOSED

    def failure(self) -> None:
        self._consecutive += 1
        state = self.state
        if state == OPEN:
            self._opened_at = self._clock()  # still failing (late replies, failed pings): wait longer
        elif state == HALF_OPEN or self._consecutive >= self.failures:
            self._trip()

    def release(self) -> None:
        """A claimed request ended with no verdict on the endpoint (cancelled, or a bad request)."""
        self._probing = False

    def _trip(self) -> None:
        self._state = OPEN
        self._opened_at = self._clock()
        self._probing = False
        self.trips += 1
