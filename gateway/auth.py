"""Bearer API keys, shared by the REST middleware and the gRPC interceptor."""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import AuthenticationError

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
# Upstream webhooks carry the upstream's signature instead of one of our keys (verified by their route).
CALLBACK_PREFIX = "/v1/callbacks/"


class ApiKeyVerifier:
    """Checks `Authorization: Bearer <key>` against the configured keys in constant time.

    With no keys configured every caller passes. Error messages never echo the key.
    """

    def __init__(self, keys: list[bytes]) -> None:
        self._keys = keys

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def verify(self, authorization: str | None) -> None:
        if not self._keys:
            return
        if not authorization:
            raise AuthenticationError("missing API key: send the header 'Authorization: Bearer <key>'")
        token = bearer_token(authorization)
        if not token:
            raise AuthenticationError("malformed Authorization header: expected 'Bearer <key>'")
        presented = token.encode()
        # Compare against every key so the time taken does not tell which one nearly matched.
        matches = [hmac.compare_digest(presented, key) for key in self._keys]
        if not any(matches):
            raise AuthenticationError("invalid API key")


def bearer_token(authorization: str | None) -> str:
    """The key of an `Authorization: Bearer <key>` value, "" when there is none. The scheme is
    case-insensitive and spaces around the key do not count, so "bearer  k" and "Bearer k" are one caller."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def caller_identity(authorization: str | None) -> str:
    """Who is asking, for scoping what callers must not share (idempotency keys): the bearer key, else the
    header as sent (no keys configured: any value passes)."""
    return bearer_token(authorization) or (authorization or "").strip()


class ApiKeyMiddleware:
    """Pure ASGI: every HTTP route but the public probes and the signed webhooks needs a valid key
    when keys are configured."""

    def __init__(self, app: ASGIApp, verifier: ApiKeyVerifier) -> None:
        self.app = app
        self.verifier = verifier

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        exempt = path in PUBLIC_PATHS or path.startswith(CALLBACK_PREFIX)
        if scope["type"] == "http" and self.verifier.enabled and not exempt:
            header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None)
            try:
                self.verifier.verify(header)
            except AuthenticationError as exc:
                response = JSONResponse(exc.body(), status_code=exc.status_code, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
