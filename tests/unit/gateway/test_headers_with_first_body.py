"""A response's status line and headers leave in one send with the body bytes written in the same turn."""

from __future__ import annotations

import asyncio
from typing import cast

from gateway.http_protocol import HeadersWithFirstBody


class RecordingTransport:
    """What reached the socket, send by send."""

    def __init__(self) -> None:
        self.sends: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sends.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def wrapped(recording: RecordingTransport) -> HeadersWithFirstBody:
    return HeadersWithFirstBody(cast(asyncio.Transport, recording), asyncio.get_running_loop())


async def test_headers_and_a_body_of_the_same_turn_are_one_send() -> None:
    recording = RecordingTransport()
    transport = wrapped(recording)
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write(b"first")
    transport.write(b"second")
    await asyncio.sleep(0)
    assert recording.sends == [b"HTTP/1.1 200 OK\r\n\r\nfirst", b"second"]


async def test_headers_without_a_body_leave_at_the_end_of_the_turn() -> None:
    recording = RecordingTransport()
    wrapped(recording).write(b"HTTP/1.1 200 OK\r\n\r\n")
    during = list(recording.sends)
    await asyncio.sleep(0)
    assert (during, recording.sends) == ([], [b"HTTP/1.1 200 OK\r\n\r\n"])


async def test_closing_sends_the_held_headers_first() -> None:
    recording = RecordingTransport()
    transport = wrapped(recording)
    transport.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    transport.close()
    assert (recording.sends, recording.closed) == ([b"HTTP/1.1 204 No Content\r\n\r\n"], True)
