"""`unless_disconnected`: a non-streamed answer's work is cancelled when its client goes away."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message

from gateway.disconnect import unless_disconnected
from gateway.errors import ClientClosedRequestError, InvalidRequestError
from tests.helpers.conditions import until


class Connection:
    """An ASGI `receive` whose body was read: it answers `http.disconnect` once `close()` is called."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.waiting = 0

    async def receive(self) -> Message:
        self.waiting += 1
        await self.closed.wait()
        return {"type": "http.disconnect"}

    def close(self) -> None:
        self.closed.set()


async def work(events: list[str], seconds: float, result: str = "answer") -> str:
    try:
        await asyncio.sleep(seconds)
        return result
    except asyncio.CancelledError:
        events.append("cancelled")
        raise
    finally:
        events.append("cleaned up")


async def test_the_answer_comes_back_and_the_watcher_stops() -> None:
    harness = asyncio.all_tasks()  # this test's task and the test runner's own
    connection, events = Connection(), list[str]()
    assert await unless_disconnected(connection.receive, work(events, 0.01)) == "answer"
    assert events == ["cleaned up"] and connection.waiting == 1
    await asyncio.sleep(0)
    assert not asyncio.all_tasks() - harness  # no watcher left


async def test_a_disconnect_cancels_the_work_after_its_clean_up_has_run() -> None:
    connection, events = Connection(), list[str]()
    asyncio.get_running_loop().call_later(0.05, connection.close)
    with pytest.raises(ClientClosedRequestError):
        await unless_disconnected(connection.receive, work(events, 30))
    assert events == ["cancelled", "cleaned up"]


async def test_a_cancelled_request_cancels_its_work_and_errors_pass_through() -> None:
    connection, events = Connection(), list[str]()
    request = asyncio.create_task(unless_disconnected(connection.receive, work(events, 30)))
    await until(lambda: connection.waiting == 1, what="the work and its watcher started")
    request.cancel()  # the request's deadline
    with pytest.raises(asyncio.CancelledError):
        await request
    await asyncio.sleep(0)
    assert events == ["cancelled", "cleaned up"]

    async def refused() -> None:
        raise InvalidRequestError("bad")

    with pytest.raises(InvalidRequestError):
        await unless_disconnected(connection.receive, refused())
