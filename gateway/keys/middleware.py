"""The REST side of the keys (pure ASGI): every route but the probes and the signed webhooks needs a key with
the route family's scope, inside its limits; the key is left in `request.state.api_key` for the routes."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth import CALLBACK_PREFIX, PUBLIC_PATHS
from gateway.errors import GatewayError
from gateway.keys.families import rest_family
from gateway.keys.gatekeeper import Gatekeeper
from gateway.keys.model import ApiKey
from gateway.keys.resolver import ANONYMOUS


class KeyMiddleware:
    def __init__(self, app: ASGIApp, gatekeeper: Gatekeeper) -> None:
        self.app = app
        self.gatekeeper = gatekeeper

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in PUBLIC_PATHS or path.startswith(CALLBACK_PREFIX):
            await self.app(scope, receive, send)
            return
        header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None)
        family = rest_family(path)
        try:
            key = self.gatekeeper.authenticate(header, family)
            await self.gatekeeper.admit(key, family)
        except GatewayError as exc:
            headers = {**exc.headers, **({"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else {})}
            await JSONResponse(exc.body(), status_code=exc.status_code, headers=headers)(scope, receive, send)
            return
        scope.setdefault("state", {})["api_key"] = key
        await self.app(scope, receive, send)


def request_key(request: Request) -> ApiKey:
    """The key the request came with (ANONYMOUS while no keys are configured)."""
    key: ApiKey = getattr(request.state, "api_key", ANONYMOUS)
    return key


def gatekeeper(request: Request) -> Gatekeeper:
    keeper: Gatekeeper = request.app.state.gatekeeper
    return keeper
