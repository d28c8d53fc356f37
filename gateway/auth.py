"""Bearer tokens and the routes that need none, shared by the REST middleware and the gRPC interceptor (the keys
themselves: `gateway.keys`)."""

from __future__ import annotations

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
# Upstream webhooks carry the upstream's signature instead of one of our keys (verified by their route).
CALLBACK_PREFIX = "/v1/callbacks/"


def bearer_token(authorization: str | None) -> str:
    """The key of an `Authorization: Bearer <key>` value, "" when there is none. The scheme is
    case-insensitive and spaces around the key do not count, so "bearer  k" and "Bearer k" are one caller."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def caller_identity(authorization: str | None) -> str:
    """Who is asking, for scoping what callers must not share (idempotency keys): the bearer key, else the
    header as sent (no keys configured: any value passes)."""
    return bearer_token(authorization) or (authorization or "").strip()
