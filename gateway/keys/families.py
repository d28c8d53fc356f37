"""Which route family a REST path or a gRPC method belongs to: the scope it needs and the requests-per-minute
bucket it counts in."""

from __future__ import annotations

from gateway.keys.model import ALL_SCOPES

# Longest prefixes first is not needed: no prefix here is a prefix of another.
_REST_PREFIXES: tuple[tuple[str, str], ...] = (
    ("/v1/embeddings", "embeddings"),
    ("/v1/chat/", "chat"),
    ("/v1/images/", "video"),
    ("/v1/tasks/", "video"),
    ("/v1/collections", "search"),
    ("/v1/admin/", "admin"),
    ("/v1/models", "models"),
    ("/v1/usage", "usage"),
    ("/v1/rerank", "rerank"),
)
_GRPC_SERVICES = {
    "gateway.v1.Embeddings": "embeddings",
    "gateway.v1.Chat": "chat",
    "gateway.v1.Images": "video",
    "gateway.v1.Search": "search",
    "gateway.v1.Models": "models",
    "gateway.v1.Rerank": "rerank",
}
OTHER = "other"  # docs and anything else: any valid key, no scope, no per-family limit


def rest_family(path: str) -> str:
    for prefix, family in _REST_PREFIXES:
        if path.startswith(prefix):
            return family
    return OTHER


def grpc_family(method: str) -> str:
    """`/gateway.v1.Chat/Complete` -> `chat`."""
    return _GRPC_SERVICES.get(method.lstrip("/").partition("/")[0], OTHER)


def required_scope(family: str) -> str | None:
    """The scope a family needs; None for the model list, the caller's own usage and the docs."""
    return family if family in ALL_SCOPES else None
