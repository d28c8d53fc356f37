"""An event-stream response whose status is settled by how its stream opens, with nothing left to set up
between the upstream's first chunk and the client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import aclosing

from starlette.datastructures import MutableHeaders
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway import sse
from gateway.disconnect import disconnected
from gateway.errors import ClientClosedRequestError, GatewayError, error_response

Opened = tuple[AsyncGenerator[str, None], Mapping[str, str]]


class OpeningEventStream(Response):
    """Server-sent events from `open_stream()`, which returns the event texts and the headers that go with
    them once the stream has opened (its first chunk is there). A `GatewayError` it raises is answered as the
    JSON error with its status, like any handler's; a client that leaves while it opens cancels it (499).

    The route returns this at once, so the framework's part of the response (middleware, this object) runs
    while the upstream prepares its first chunk; the headers and the first events then go out together.
    `release` runs when the response ends, however it ends, opened or not."""

    media_type = sse.MEDIA_TYPE

    def __init__(self, open_stream: Callable[[], Awaitable[Opened]], release: Callable[[], Awaitable[object]]) -> None:
        # Not Response.__init__: it would render an empty body and announce its length.
        self.status_code = 200
        self.background = None
        self.init_headers(sse.HEADERS)
        self._open = open_stream
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The stream opens in this task, not in one of its own: a task would start a loop turn later and
        # its result reach this one a turn after it ends, both on the way to the first chunk. The client
        # leaving cancels this task instead, until the last event has gone out.
        this = asyncio.current_task()
        assert this is not None
        watching = True

        async def cancel_on_disconnect() -> None:
            await disconnected(receive)
            if watching:  # after the last event, the end of the response reads as a disconnect too
                this.cancel()

        watcher = asyncio.ensure_future(cancel_on_disconnect())
        try:
            try:
                events, headers = await self._open()
            except asyncio.CancelledError:
                if not _client_left(watcher):
                    raise  # cancelled from outside (the deadline, the server's shutdown)
                this.uncancel()
                left = ClientClosedRequestError("the client closed the connection before the answer was ready")
                await error_response(left, scope["method"], scope["path"])(scope, receive, send)
                return
            except GatewayError as exc:
                watching = False
                await error_response(exc, scope["method"], scope["path"])(scope, receive, send)
                return
            MutableHeaders(raw=self.raw_headers).update(headers)
            try:
                await self._stream(events, send)
            except asyncio.CancelledError:
                if not _client_left(watcher):
                    raise
                this.uncancel()
                return
            watching = False
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watching = False
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await self._release()

    async def _stream(self, events: AsyncGenerator[str, None], send: Send) -> None:
        """Write each event text as it comes; a client that goes away ends the stream (and so the upstream
        call): the server would otherwise drop the writes and let the upstream run to its end."""
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async with aclosing(events):
            async for text in events:
                await send({"type": "http.response.body", "body": text.encode(), "more_body": True})


def _client_left(watcher: asyncio.Future[None]) -> bool:
    """Whether the disconnect watcher has ended by seeing the client leave (not by being cancelled)."""
    return watcher.done() and not watcher.cancelled()
