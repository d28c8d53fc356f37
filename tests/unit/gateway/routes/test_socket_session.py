"""A task WebSocket's session with the real permits: a follow that ends while a subscription is answered gives back
one permit, not the subscription's; a failure reading the client's messages closes with 1011; a detail kept from
the client is logged."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import pytest
from starlette.websockets import WebSocketState

from gateway.errors import UpstreamUnavailableError
from gateway.keys.model import ApiKey
from gateway.keys.watchers import KeyWatchers, WatcherPermits
from gateway.limits import watcher_limit
from gateway.routes.socket_handshake import Caller
from gateway.routes.socket_session import TaskSocket, refuse
from gateway.services.video import Task

KEY = ApiKey(id="key_a", secret_hash="", prefix="sk-…a", name="a", team="default")


class FakeWebSocket:
    """Starlette's side of an accepted socket: the client's messages are queued; `on_send` sees each one sent."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sent: list[dict[str, Any]] = []
        self.closed: tuple[int, str] | None = None
        self.application_state = WebSocketState.CONNECTED
        self.on_send: Callable[[dict[str, Any]], Awaitable[None]] | None = None

    def say(self, message: dict[str, Any]) -> None:
        self.incoming.put_nowait({"type": "websocket.receive", "text": json.dumps(message)})

    def leave(self) -> None:
        self.incoming.put_nowait({"type": "websocket.disconnect", "code": 1000})

    async def receive(self) -> dict[str, Any]:
        return await self.incoming.get()

    async def send_text(self, text: str) -> None:
        message = json.loads(text)
        self.sent.append(message)
        if self.on_send is not None:
            await self.on_send(message)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed = (code, reason)
        self.application_state = WebSocketState.DISCONNECTED


class FakeVideo:
    """The video service's watch: each task sends no event and ends (or fails) when the test says."""

    def __init__(self) -> None:
        self.ends: dict[str, asyncio.Future[None]] = {}

    async def watch(self, task_id: str, after: int | None = None) -> AsyncGenerator[Task, None]:
        end = self.ends.setdefault(task_id, asyncio.get_running_loop().create_future())
        return self._changes(end)

    @staticmethod
    async def _changes(end: asyncio.Future[None]) -> AsyncGenerator[Task, None]:
        await end
        changes: list[Task] = []
        for task in changes:
            yield task


def session(websocket: FakeWebSocket, video: FakeVideo, permits: WatcherPermits) -> TaskSocket:
    return TaskSocket(websocket, video, permits, Caller(KEY, None))  # type: ignore[arg-type]


async def test_a_follow_that_ends_while_a_subscription_is_answered_gives_back_one_permit() -> None:
    process, keys = watcher_limit(10), KeyWatchers(4)
    permits = WatcherPermits(process, keys, KEY)
    websocket, video = FakeWebSocket(), FakeVideo()

    async def first_follow_fails_meanwhile(message: dict[str, Any]) -> None:
        if message.get("type") == "subscribed" and message["task_ids"] == ["b", "c", "d"]:
            video.ends["a"].set_exception(UpstreamUnavailableError("task store unavailable"))
            await asyncio.sleep(0.01)  # a's follow ends while this answer is being sent

    websocket.on_send = first_follow_fails_meanwhile
    serving = asyncio.create_task(session(websocket, video, permits).serve())
    websocket.say({"type": "subscribe", "task_ids": ["a"]})
    await asyncio.sleep(0.01)
    websocket.say({"type": "subscribe", "task_ids": ["b", "c", "d"]})
    await asyncio.sleep(0.05)
    assert (permits.held, keys.held(KEY)) == (3, 3), "one permit per task followed: b, c and d"
    other = WatcherPermits(process, keys, KEY)
    other.hold(1)  # the key's fourth watcher, elsewhere
    video.ends["b"].set_result(None)
    await asyncio.sleep(0.01)
    assert (permits.held, keys.held(KEY)) == (2, 3)
    websocket.leave()
    assert await serving == "client"
    assert (permits.held, keys.held(KEY), process.count) == (0, 1, 1)
    errors = [m for m in websocket.sent if m["type"] == "error"]
    assert [e.get("task_id") for e in errors] == ["a"]


async def test_a_failure_reading_the_clients_messages_closes_with_internal_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class BrokenWebSocket(FakeWebSocket):
        async def receive(self) -> dict[str, Any]:
            raise RuntimeError("a bug")

    websocket = BrokenWebSocket()
    permits = WatcherPermits(watcher_limit(10), KeyWatchers(4), KEY)
    assert await session(websocket, FakeVideo(), permits).serve() == "1011"
    assert websocket.closed == (1011, "internal error") and permits.held == 0
    assert any(r.message == "task WebSocket failed" and r.exc_info for r in caplog.records)


async def test_an_errors_detail_is_logged_and_not_sent(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.routes.socket_session")
    websocket = FakeWebSocket()
    error = UpstreamUnavailableError("task store unavailable", detail="redis at 10.1.2.3:6379: connection refused")
    assert await refuse(websocket, error) == "1013"  # type: ignore[arg-type]
    assert "10.1.2.3" not in json.dumps(websocket.sent)
    assert any("10.1.2.3" in r.getMessage() for r in caplog.records)
