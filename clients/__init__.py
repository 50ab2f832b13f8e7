"""clients: typed Triton clients over tritonclient (HTTP and gRPC, sync and asyncio), and a router
over several endpoints with fallback and request coalescing."""

from tritonkit.clients.client import AsyncClient, Client, ModelMeta
from tritonkit.clients.errors import (
    AccessDeniedError,
    BadInputError,
    ModelNotReadyError,
    QueueFullError,
    RequestTimeoutError,
    TritonRequestError,
    UnavailableError,
    classify,
)
from tritonkit.clients.router import (
    AsyncRouter,
    DeadlineExceededError,
    NoEndpointError,
    Routed,
    Router,
    RouterPolicy,
)

__all__ = [
    "AccessDeniedError", "AsyncClient", "AsyncRouter", "BadInputError", "Client", "DeadlineExceededError",
    "ModelMeta", "ModelNotReadyError", "NoEndpointError", "QueueFullError", "RequestTimeoutError", "Routed",
    "Router", "RouterPolicy", "TritonRequestError", "UnavailableError", "classify",
]
