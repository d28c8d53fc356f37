"""The REST side of the keys (pure ASGI): every route but the probes and the signed webhooks needs a key with
the route family's scope, inside its limits; the key is left in `request.state.api_key` and in `CURRENT_KEY` for
the billed services, and what they record is answered as `X-Request-Cost` (gRPC's interceptor does the same)."""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.auth import CALLBACK_PREFIX, PUBLIC_PATHS
from gateway.errors import GatewayError, send_error
from gateway.keys.context import CURRENT_KEY
from gateway.keys.families import rest_family
from gateway.keys.gatekeeper import Gatekeeper
from gateway.keys.model import ApiKey
from gateway.keys.resolver import ANONYMOUS
from gateway.usage.call_cost import CURRENT_COST, CallCost


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
            await send_error(exc, scope, receive, send)
            return
        scope.setdefault("state", {})["api_key"] = key
        CURRENT_KEY.set(key)  # this request's task: the billed services record its usage with it
        cost = CallCost()
        CURRENT_COST.set(cost)  # ... and add what that usage cost, answered as X-Request-Cost

        async def send_with_cost(message: Message) -> None:
            if message["type"] == "http.response.start" and (header := cost.header()) is not None:
                MutableHeaders(scope=message).append(*header)
            await send(message)

        await self.app(scope, receive, send_with_cost)


def request_key(request: Request) -> ApiKey:
    """The key the request came with (ANONYMOUS while no keys are configured)."""
    key: ApiKey = getattr(request.state, "api_key", ANONYMOUS)
    return key
