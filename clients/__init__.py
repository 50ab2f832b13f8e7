"""clients: typed Triton clients over tritonclient (HTTP and gRPC, sync and asyncio), and a router
over several endpoints with fallback and request coalescing."""

from tritonkit.clients.client import AsyncClient, Client, ModelMeta
from tritonkit.clients.errors import (
    AccessDeniedError,
    BadInputError,
    DeadlineExceededError,
    ModelNotReadyError,
    QueueFullError,
    RefusedError,
    RequestTimeoutError,
    ThrottledError,
    TritonRequestError,
    UnavailableError,
    classify,
)
from tritonkit.clients.router import (
    AsyncRouter,
    NoEndpointError,
    Routed,
    Router,
    RouterPolicy,
)

__all__ = [
    "AccessDeniedError", "AsyncClient", "AsyncRouter", "BadInputError", "Client", "DeadlineExceededError",
    "ModelMeta", "ModelNotReadyError", "NoEndpointError", "QueueFullError", "RefusedError", "RequestTimeoutError",
    "Routed", "Router", "RouterPolicy", "ThrottledError", "TritonRequestError", "UnavailableError", "classify",
]
