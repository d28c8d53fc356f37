"""Task changes pushed over WebSocket, and the watch tokens browsers open them with.

- `POST /v1/tasks/{id}/token`: a short-lived token that opens sockets on that task (a `video` key asks for it);
- `GET /v1/tasks/{id}/ws` (WebSocket): the task's events, `done`, then close 1000; `?last_event_id=N` resumes;
- `GET /v1/ws` (WebSocket): the events of every task the client subscribes to, until it closes.

The events are the event stream's (`/v1/tasks/{id}/events`), counted under the same watcher limits. How a socket
opens: `socket_handshake`; what it carries: `socket_session` and `gateway.protocol.sockets`.
"""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocket

from gateway.billing import BilledVideo
from gateway.errors import GatewayError
from gateway.protocol.openai import ErrorResponse
from gateway.protocol.sockets import WatchTokenObject
from gateway.routes import include
from gateway.routes.nesting import NestingLimitedRoute
from gateway.routes.socket_handshake import (
    OriginNotAllowedError,
    authenticate,
    origin_allowed,
    policy,
    require_task,
    subprotocol,
)
from gateway.routes.socket_session import TaskSocket, refuse
from gateway.routes.task_events import resume_point

log = logging.getLogger("gateway.access")
router = APIRouter(route_class=NestingLimitedRoute)

ERRORS = {code: {"model": ErrorResponse} for code in (401, 403, 404, 429, 503)}


def video(connection: Request | WebSocket) -> BilledVideo:
    service: BilledVideo = connection.app.state.video
    return service


@router.post("/v1/tasks/{task_id}/token", response_model=WatchTokenObject, responses=ERRORS)  # type: ignore[arg-type]
async def create_watch_token(task_id: str, request: Request) -> WatchTokenObject:
    """A token for a browser to watch this task over WebSocket (`GET /v1/tasks/{id}/ws`), in this key's name, for
    `GATEWAY_WATCH_TOKEN_SECONDS`: the page's back end asks for it, so that no API key sits in the page."""
    token = await video(request).watch_token(task_id)
    return WatchTokenObject(token=token.token, task_id=token.task_id, expires_at=token.expires_at)


@router.websocket("/v1/tasks/{task_id}/ws")
async def task_socket(websocket: WebSocket, task_id: str) -> None:
    started = time.perf_counter()
    _logged("/v1/tasks/{task_id}/ws", await _serve(websocket, task_id), started)


@router.websocket("/v1/ws")
async def tasks_socket(websocket: WebSocket) -> None:
    started = time.perf_counter()
    _logged("/v1/ws", await _serve(websocket, None), started)


async def _serve(websocket: WebSocket, task_id: str | None) -> str:
    """How the socket ended: refused at the handshake (403), the gateway's close code, or `client`."""
    rules = policy(websocket)
    if not origin_allowed(websocket, rules.origins):
        return await _deny(websocket, OriginNotAllowedError("this page's origin is not in GATEWAY_CORS_ALLOW_ORIGINS"))
    await websocket.accept(subprotocol=subprotocol(websocket))
    service = video(websocket)
    try:
        caller = await authenticate(websocket, rules, service.tokens)
        if task_id is not None:
            require_task(caller, task_id)
    except GatewayError as exc:
        return await refuse(websocket, exc)
    after = resume_point(websocket.query_params.get("last_event_id"))
    return await TaskSocket(websocket, service, rules.permits(caller.key), caller).serve(task_id, after)


async def _deny(websocket: WebSocket, exc: GatewayError) -> str:
    """Refuse the handshake itself: the error's status and body where the server can send a response to a
    handshake (uvicorn can), else a bare 403."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(JSONResponse(exc.body(), status_code=exc.status_code))
    else:
        await websocket.close(code=1008)
    return str(exc.status_code)


def _logged(route: str, outcome: str, started: float) -> None:
    """The socket's access line, in place of the server's (which holds the URL's query and the client's address):
    its route, how it ended, how long it was open."""
    if log.isEnabledFor(logging.INFO):
        log.info(
            "websocket",
            extra={"route": route, "close": outcome, "ms": round((time.perf_counter() - started) * 1000, 1)},
        )


def attach_router(app: FastAPI) -> None:
    include(app, router)
