"""uvicorn's httptools protocol with a deadline on request headers, whose responses' headers leave with
their first body bytes.

uvicorn closes a keep-alive connection that stays idle after a response, but a connection that never
sends a request, or sends its headers a byte at a time, is held open for ever: enough of them (a
slowloris, or a pool of clients that leak connections) use up the process's file descriptors and every
route fails. Here each connection must complete a request's headers within the deadline, counted from
when it opens, or from the end of the keep-alive idle time after its last response (an idle kept-alive
connection is uvicorn's to close, after `timeout_keep_alive`).

uvicorn writes a response's status line and headers as soon as the app starts the response, and its body
in further writes: two sends, two segments, and two wake-ups of the client, where one would do. Here the
headers wait for the first body bytes written in the same event-loop turn (a JSON answer's whole body, a
stream's first events) and leave with them in one send; with no body by the end of the turn they leave alone.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeaderDeadlineProtocol(HttpToolsProtocol):
    header_timeout_seconds: ClassVar[float] = 15.0
    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._disarm_header_deadline()
        super().on_headers_complete()
        if self.cycle is not None:  # the request's cycle (it writes the response) was made just now
            self.cycle.transport = HeadersWithFirstBody(self.transport, self.loop)  # type: ignore[assignment]

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # a request already read starts now: its headers are complete
        super().on_response_complete()
        if not pipelined:
            self._arm_header_deadline(idle=self.timeout_keep_alive)

    def _arm_header_deadline(self, idle: float = 0.0) -> None:
        self._disarm_header_deadline()
        if not self.transport.is_closing():
            self._header_deadline = self.loop.call_later(idle + self.header_timeout_seconds, self._headers_overdue)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_overdue(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing():
            self.transport.close()


class HeadersWithFirstBody:
    """One response's transport: its first write (the status line and headers) is held until the next write
    or the end of the event-loop turn, whichever comes first, and then sent with it."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._first = True

    def write(self, data: bytes) -> None:
        if self._first:
            self._first = False
            self._held = data
            self._loop.call_soon(self._flush)
            return
        if self._held is not None:
            data, self._held = self._held + data, None
        self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def _flush(self) -> None:
        if self._held is not None:
            data, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(data)


def with_header_deadline(seconds: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class to give `uvicorn.Config(http=...)`, with this deadline."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout_seconds": seconds})
