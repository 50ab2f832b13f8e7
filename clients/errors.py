"""Triton's errors, mapped to types a caller can catch and a load test can count.

Triton reports these as text (HTTP) or a status plus text (gRPC); the texts below are the ones
Triton 2.x emits. Anything unrecognised stays a plain TritonRequestError with Triton's message.
"""

from __future__ import annotations

from tritonclient.utils import InferenceServerException

from tritonkit.errors import KitError


class TritonRequestError(KitError):
    kind = "other"

    def __init__(self, message: str, status: str | None = None):
        super().__init__(message)
        self.status = status


class QueueFullError(TritonRequestError):
    """The model's queue is at max_queue_size: the request was rejected at once."""
    kind = "queue_full"


class RequestTimeoutError(TritonRequestError):
    """The request waited in the queue past its timeout and was rejected."""
    kind = "timeout"


class DeadlineExceededError(RequestTimeoutError):
    """No answer within the request's deadline: the client's own (across a router's attempts), or
    the gateway's route timeout, which cancels the request upstream rather than answer it late."""
    kind = "deadline"


class RefusedError(TritonRequestError):
    """The gateway's admission turned the request away at once: its limit of requests in flight
    was full (Envoy's circuit breaker overflowed)."""
    kind = "refused"


class ThrottledError(TritonRequestError):
    """The client's own adaptive throttle refused the request without sending it (clients/throttle.py)."""
    kind = "throttled"


class BadInputError(TritonRequestError):
    """Wrong shape, dtype or input name: the request itself is wrong."""
    kind = "bad_input"
    exit_code = 2


class ModelNotReadyError(TritonRequestError):
    """The model is unknown, unloaded or still loading."""
    kind = "not_ready"


class AccessDeniedError(TritonRequestError):
    """A restricted API (model control) was called without the right key header."""
    kind = "access_denied"


class UnavailableError(TritonRequestError):
    """The server could not be reached."""
    kind = "unavailable"


_PATTERNS: list[tuple[tuple[str, ...], type[TritonRequestError]]] = [
    (("exceeds maximum queue size",), QueueFullError),
    # Envoy's words in front of Triton: its circuit breaker, and its route timeout
    (("reset reason: overflow", "reached concurrency limit"), RefusedError),
    (("upstream request timeout", "deadline exceeded"), DeadlineExceededError),
    (("request timeout expired", "timeout expired"), RequestTimeoutError),
    (("unexpected shape", "unexpected datatype", "data-type is", "unexpected inference input",
      "invalid argument", "unable to find", "must specify", "inputs disagree", "is missing",
      "unexpected number of inputs"), BadInputError),
    (("is not ready", "is not found", "unknown model", "unavailable model"), ModelNotReadyError),
    (("is restricted", "expecting header"), AccessDeniedError),
    (("failed to connect", "connection refused", "socket closed", "connect call failed",
      "cannot connect", "name resolution",
      # Envoy's, when the server behind it is down or went down with the request in flight
      "reset reason: connection failure", "reset reason: connection termination",
      "reset reason: remote connection failure", "no healthy upstream"), UnavailableError),
]


def classify(exc: BaseException) -> TritonRequestError:
    """Turn a tritonclient (or socket) exception into the matching typed error."""
    if isinstance(exc, TritonRequestError):
        return exc
    message = exc.message() if isinstance(exc, InferenceServerException) else str(exc)
    status = exc.status() if isinstance(exc, InferenceServerException) else None
    text = (message or "").lower()
    for needles, cls in _PATTERNS:
        if any(n in text for n in needles):
            return cls(message, status)
    if status == "StatusCode.CANCELLED":
        # the kit's own cancellations end as asyncio's CancelledError, never as a status: this one is
        # the server's (or Envoy's) abandoning a request in flight, as a Triton shutting down does
        return UnavailableError(f"the server cancelled the request ({message}): it was going down", status)
    if isinstance(exc, (ConnectionError, OSError)):
        return UnavailableError(str(exc) or type(exc).__name__)
    return TritonRequestError(message or type(exc).__name__, status)
