"""One open task WebSocket: the tasks it follows, the watcher permits they hold, its one writer, its close.

Each followed task runs the same watch as the event stream (`BilledVideo.watch`: the task now, then each visible
change through the task store's change feed, so a change written on any replica arrives) and sends the same task
object. A socket holds one watcher permit per task it follows, and one while it follows none. On
`GET /v1/tasks/{id}/ws` the socket follows its one task and closes with 1000 after `done`; on `GET /v1/ws` it
follows what the client subscribes to until the client closes it. Message shapes: `gateway.protocol.sockets`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from contextlib import aclosing, suppress
from typing import Any

from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from gateway import metrics
from gateway.billing import BilledVideo
from gateway.errors import GatewayError, InvalidRequestError
from gateway.keys.watchers import WatcherPermits
from gateway.protocol.sockets import SubscriptionMessage
from gateway.routes.socket_handshake import Caller, require_task
from gateway.services.video import Task, public_task

log = logging.getLogger(__name__)

NORMAL = 1000  # the task ended (done), or the client closed
POLICY = 1008  # refused: credentials, limits, a bad request
INTERNAL = 1011
TRY_AGAIN_LATER = 1013  # the task store or an upstream is unavailable
MAX_REASON_BYTES = 123  # what a close frame's reason may hold


def close_code(exc: GatewayError) -> int:
    if exc.status_code in (502, 503, 504):
        return TRY_AGAIN_LATER
    return INTERNAL if exc.status_code >= 500 else POLICY


def close_reason(message: str) -> str:
    encoded = message.encode()
    if len(encoded) <= MAX_REASON_BYTES:
        return message
    return encoded[: MAX_REASON_BYTES - 3].decode(errors="ignore") + "..."


def error_text(exc: GatewayError, task_id: str | None = None) -> str:
    """`exc` as a socket's error message; the detail kept from the client is logged, as REST's handler does."""
    if exc.detail:
        log.warning("task WebSocket sent %d: %s", exc.status_code, exc)
    about = {"task_id": task_id} if task_id is not None else {}
    return json.dumps({"type": "error", **exc.body(), **about}, ensure_ascii=False)


def event_text(task: Task) -> str:
    """The task object exactly as the event stream and GET /v1/tasks/{id} render it; its version as the id."""
    return f'{{"type":"event","id":{task.version},"task":{public_task(task).model_dump_json()}}}'


async def refuse(websocket: WebSocket, exc: GatewayError) -> str:
    """Send `exc` as the socket's only message and close it with its code (the socket is accepted); the code."""
    code = close_code(exc)
    with suppress(WebSocketDisconnect, RuntimeError, OSError):  # the client left first
        await websocket.send_text(error_text(exc))
        await websocket.close(code, close_reason(exc.message))
    metrics.TASK_SOCKET_CLOSES.labels(code=str(code)).inc()
    return str(code)


class TaskSocket:
    def __init__(self, websocket: WebSocket, video: BilledVideo, permits: WatcherPermits, caller: Caller) -> None:
        self._websocket = websocket
        self._video = video
        self._permits = permits
        self._caller = caller
        self._follows: dict[str, asyncio.Task[None]] = {}
        self._writing = asyncio.Lock()
        self._ended = asyncio.Event()
        self._close: tuple[int, str] = (NORMAL, "")
        self._gone = False  # the client left: nothing more can be sent

    async def serve(self, task_id: str | None = None, after: int | None = None) -> str:
        """Until the client leaves or, given `task_id` (the one-task route), until that task's end. Returns how it
        closed: the gateway's close code, or `client`."""
        try:
            self._permits.hold(1)
        except GatewayError as exc:
            return await refuse(self._websocket, exc)
        metrics.TASK_SOCKETS.inc()
        try:
            if task_id is not None:
                self._follow(task_id, after, closes=True)
            await self._until_ended(reads=task_id is None)
        finally:
            await self._stop(list(self._follows.values()))
            self._permits.release()
            metrics.TASK_SOCKETS.dec()
        return await self._close_socket()

    async def _until_ended(self, *, reads: bool) -> None:
        reader = asyncio.ensure_future(self._read(reads))
        ended = asyncio.ensure_future(self._ended.wait())
        try:
            await asyncio.wait({reader, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            failures = await self._stop([reader, ended])
        if failures:  # a bug reading or answering a message: not a normal close
            log.error("task WebSocket failed", exc_info=failures[0])
            self._close = (INTERNAL, "internal error")

    async def _read(self, reads: bool) -> None:
        """The client's messages until it leaves (the one-task route takes none)."""
        while True:
            message = await self._websocket.receive()
            if message["type"] == "websocket.disconnect":
                self._gone = True
                return
            if not reads:
                await self._send(error_text(InvalidRequestError("this socket takes no messages: use /v1/ws")))
            elif message.get("text") is None:
                await self._send(error_text(InvalidRequestError("expected a JSON text message, got binary")))
            else:
                await self._handle(message["text"])

    async def _handle(self, text: str) -> None:
        try:
            request = SubscriptionMessage.model_validate_json(text)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            await self._send(error_text(InvalidRequestError(f"{where}: {first['msg']}" if where else first["msg"])))
            return
        except InvalidRequestError as exc:
            await self._send(error_text(exc))
            return
        if request.type == "unsubscribe":
            await self._stop([self._follows[i] for i in dict.fromkeys(request.task_ids) if i in self._follows])
            await self._send(json.dumps({"type": "unsubscribed", "task_ids": request.task_ids}, ensure_ascii=False))
            return
        await self._subscribe(list(dict.fromkeys(request.task_ids)), request.last_event_ids)

    async def _subscribe(self, task_ids: list[str], last_event_ids: dict[str, int]) -> None:
        allowed = []
        for task_id in task_ids:
            try:
                require_task(self._caller, task_id)
                allowed.append(task_id)
            except GatewayError as exc:
                await self._send(error_text(exc, task_id))
        new = [task_id for task_id in allowed if task_id not in self._follows]
        try:
            self._permits.hold(max(1, len(self._follows) + len(new)))
        except GatewayError as exc:  # over a watcher limit: the socket is closed, as the limit says
            await self._send(error_text(exc))
            self._end(exc)
            return
        await self._send(json.dumps({"type": "subscribed", "task_ids": allowed}, ensure_ascii=False))
        for task_id in new:
            self._follow(task_id, last_event_ids.get(task_id), closes=False)

    def _follow(self, task_id: str, after: int | None, *, closes: bool) -> None:
        self._follows[task_id] = asyncio.create_task(self._events(task_id, after, closes), name=f"socket:{task_id}")

    async def _events(self, task_id: str, after: int | None, closes: bool) -> None:
        """Send the task's events and `done`; an error instead ends this task's follow (and `closes`: the socket)."""
        failure: GatewayError | None = None
        try:
            changes = await self._video.watch(task_id, after)
            async with aclosing(changes):
                async for task in changes:
                    await self._send(event_text(task))
            await self._send(json.dumps({"type": "done", "task_id": task_id}))
        except GatewayError as exc:
            failure = exc
        except Exception:
            log.exception("following task %s over a WebSocket failed", task_id)
            failure = GatewayError("internal error")
        finally:
            if self._follows.get(task_id) is asyncio.current_task():
                del self._follows[task_id]
                if not closes:
                    # One permit back, never one taken: a subscription may hold permits for follows it has not
                    # added yet (it awaits its answer first), which the follows' count would give back.
                    self._permits.hold(max(1, self._permits.held - 1))
        if failure is not None:
            await self._send(error_text(failure, task_id))
        if closes:
            self._end(failure)

    def _end(self, failure: GatewayError | None) -> None:
        if failure is not None:
            self._close = (close_code(failure), close_reason(failure.message))
        self._ended.set()

    async def _send(self, text: str) -> None:
        if self._gone:
            return
        async with self._writing:  # one frame at a time, whichever task sends it
            try:
                await self._websocket.send_text(text)
            except (WebSocketDisconnect, RuntimeError, OSError):
                self._gone = True
                self._ended.set()

    async def _close_socket(self) -> str:
        outcome = "client"  # the client closed or vanished: its code is its own (and not a bounded label)
        if not self._gone:
            code, reason = self._close
            if self._websocket.application_state == WebSocketState.CONNECTED:
                with suppress(WebSocketDisconnect, RuntimeError, OSError):  # the client left meanwhile
                    await self._websocket.close(code, reason)
            outcome = str(code)
        metrics.TASK_SOCKET_CLOSES.labels(code=outcome).inc()
        return outcome

    @staticmethod
    async def _stop(tasks: Sequence[asyncio.Future[Any]]) -> list[Exception]:
        """Cancel `tasks` and wait for them; the errors of those that had failed."""
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return [result for result in results if isinstance(result, Exception)]
