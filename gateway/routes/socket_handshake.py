"""The opening of a task WebSocket: its Origin, its credentials, its subprotocol.

The key is checked at the handshake, once: `Authorization: Bearer <key>` (servers, scripts), or a watch token offered
as the subprotocol `token.<token>` beside `ai-gateway.v1` (browsers, which cannot set headers on a WebSocket). A key
or token in the URL is refused rather than used: URLs end up in proxies' and browsers' logs. The server answers
`ai-gateway.v1` and never echoes the token. Everything here is local (a hash, a dict lookup, an HMAC) but the key's
requests-per-minute check, which is the one every request of the `video` family makes: a refused socket causes no
outbound call.

A socket from an Origin that GATEWAY_CORS_ALLOW_ORIGINS does not list is refused before it opens (HTTP 403): a page
of another site must not watch tasks with a token it got hold of. Any other refusal opens the socket, sends the
error as a message and closes it with 1008 and a reason, so that a page can tell a stale token (fetch a new one)
from a network failure, which a refused handshake would look like to it.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.websockets import WebSocket

from gateway.errors import InvalidRequestError, PermissionDeniedError
from gateway.keys.gatekeeper import Gatekeeper
from gateway.keys.model import ApiKey
from gateway.keys.watch_tokens import WatchTokenError, WatchTokens
from gateway.keys.watchers import WatcherPermits
from gateway.limits import InFlightLimit
from gateway.protocol.sockets import SUBPROTOCOL, TOKEN_SUBPROTOCOL_PREFIX

FAMILY = "video"
# Query parameters that would put a credential in the URL.
URL_CREDENTIALS = frozenset({"key", "api_key", "apikey", "token", "access_token", "watch_token", "authorization"})


class OriginNotAllowedError(PermissionDeniedError):
    """A WebSocket's `Origin` (the page that opened it) is not listed in `GATEWAY_CORS_ALLOW_ORIGINS`; the handshake
    is refused with 403.

    Do: operator: add the page's origin (scheme://host[:port]) to `GATEWAY_CORS_ALLOW_ORIGINS`.
    """

    code = "origin_not_allowed"


@dataclass(frozen=True)
class SocketPolicy:
    """What the socket routes check, built with the app (`app.state.task_sockets`)."""

    gatekeeper: Gatekeeper
    watchers: InFlightLimit  # the process's watcher budget, shared with the event streams
    origins: frozenset[str]  # lower case; "*" allows any

    def permits(self, key: ApiKey) -> WatcherPermits:
        return WatcherPermits(self.watchers, self.gatekeeper.watchers, key)


@dataclass(frozen=True)
class Caller:
    """Whom a socket serves: the key it counts against, and with a watch token the one task it may follow."""

    key: ApiKey
    only_task: str | None


def policy(websocket: WebSocket) -> SocketPolicy:
    found: SocketPolicy = websocket.app.state.task_sockets
    return found


def origin_allowed(websocket: WebSocket, origins: frozenset[str]) -> bool:
    """No Origin (not a browser) passes; a browser's must be listed."""
    origin = websocket.headers.get("origin")
    return origin is None or "*" in origins or origin.rstrip("/").lower() in origins


def subprotocol(websocket: WebSocket) -> str | None:
    """The subprotocol to answer: ours when offered. A browser that offered some fails a handshake answered with
    none, so a page must offer ours with its token."""
    return SUBPROTOCOL if SUBPROTOCOL in websocket.scope.get("subprotocols", ()) else None


async def authenticate(websocket: WebSocket, socket_policy: SocketPolicy, tokens: WatchTokens) -> Caller:
    """The caller, or the `GatewayError` to close the socket with."""
    if URL_CREDENTIALS & {name.lower() for name in websocket.query_params}:
        raise InvalidRequestError(
            "credentials are not accepted in the URL: send 'Authorization: Bearer <key>', or offer a watch token as "
            f"the subprotocol '{TOKEN_SUBPROTOCOL_PREFIX}<token>' beside '{SUBPROTOCOL}'",
            code="credentials_in_url",
        )
    gatekeeper = socket_policy.gatekeeper
    header = websocket.headers.get("authorization")
    token = _offered_token(websocket)
    if header is not None or token is None:
        caller = Caller(gatekeeper.authenticate(header, FAMILY), None)
    else:
        claims = tokens.verify(token)
        caller = Caller(gatekeeper.authenticate_id(claims.key_id, FAMILY), claims.task_id)
    await gatekeeper.admit(caller.key, FAMILY)
    return caller


def require_task(caller: Caller, task_id: str) -> None:
    """A watch token opens sockets on its own task only."""
    if caller.only_task is not None and caller.only_task != task_id:
        raise WatchTokenError(f"this watch token is for another task than {task_id}")


def _offered_token(websocket: WebSocket) -> str | None:
    for offered in websocket.scope.get("subprotocols", ()):
        if offered.startswith(TOKEN_SUBPROTOCOL_PREFIX):
            return str(offered[len(TOKEN_SUBPROTOCOL_PREFIX) :])
    return None
