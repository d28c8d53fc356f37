"""The REST side of the keys (pure ASGI): every route but the probes and the signed webhooks needs a key with
the route family's scope, inside its limits (a task's event stream: one of its key's watchers too); the request is
billed to the key (`billing.bill_to`), and what its records cost is answered as `X-Request-Cost` (gRPC's interceptor
does the same)."""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.auth import CALLBACK_PREFIX, PUBLIC_PATHS
from gateway.billing import bill_to
from gateway.errors import GatewayError, send_error
from gateway.keys.families import rest_family
from gateway.keys.gatekeeper import Gatekeeper
from gateway.keys.watchers import WatcherPermits
from gateway.limits import is_task_watch


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
        watcher: WatcherPermits | None = None
        try:
            key = self.gatekeeper.authenticate(header, family)
            await self.gatekeeper.admit(key, family)
            if is_task_watch(path):  # an event stream holds one of its key's watchers while it is open
                # The process's permit is the limits middleware's, taken before any key was known.
                watcher = WatcherPermits(None, self.gatekeeper.watchers, key)
                watcher.hold(1)
        except GatewayError as exc:
            await send_error(exc, scope, receive, send)
            return
        cost = bill_to(key)

        async def send_with_cost(message: Message) -> None:
            if message["type"] == "http.response.start" and (header := cost.header()) is not None:
                MutableHeaders(scope=message).append(*header)
            await send(message)

        try:
            await self.app(scope, receive, send_with_cost)
        finally:
            if watcher is not None:
                watcher.release()
