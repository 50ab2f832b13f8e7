"""clients: typed Triton clients over tritonclient (HTTP and gRPC, sync and asyncio)."""

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

__all__ = [
    "AccessDeniedError", "AsyncClient", "BadInputError", "Client", "ModelMeta", "ModelNotReadyError", "QueueFullError",
    "RequestTimeoutError", "TritonRequestError", "UnavailableError", "classify",
]
