"""How an answer goes out over time: the SSE stream after the time to first token, one piece per token interval,
with characters split across writes or the stream cut off on request; a non-streaming answer when a stream of
it would have ended."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import anyio
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from simulators.hunyuan.config import SimulatorConfig
from simulators.hunyuan.replies import Answer
from simulators.hunyuan.stats import SimulatorStats


class _StreamDroppedError(Exception):
    """Raised inside a stream to cut the connection without [DONE]."""


def _piece_seconds(config: SimulatorConfig) -> float:
    return 1.0 / config.tokens_per_second if config.tokens_per_second else 0.0


def _sse(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def _split_point(data: bytes) -> int | None:
    """The index just after the lead byte of the first multi-byte UTF-8 character, if any."""
    return next((index + 1 for index, byte in enumerate(data) if byte >= 0xC0), None)


def _writes(event: bytes, split_utf8: bool) -> list[bytes]:
    """One network write per event, or two with a character cut in half when `split_utf8` is on."""
    cut = _split_point(event) if split_utf8 else None
    return [event] if cut is None else [event[:cut], event[cut:]]


async def _until(deadline: float) -> None:
    """Sleep until the event loop's clock reads `deadline`; at once if it is past."""
    delay = deadline - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)


async def events(answer: Answer, config: SimulatorConfig, *, include_usage: bool) -> AsyncGenerator[bytes, None]:
    """The stream: role chunk and first piece after the TTFT, the other pieces paced, the usage chunk if asked
    for, then [DONE].

    Piece n leaves at (first piece + n intervals), as a model's tokens come on its own schedule: a piece that
    left late (this process waited for a core) does not push the ones after it back. Sleeping one interval
    per piece would add every wake-up's lateness to the rest of the stream, and on a machine shared with a
    proxy under test, charge the simulator's own waits to the proxy."""
    await asyncio.sleep(config.ttft_seconds)
    first_piece = asyncio.get_running_loop().time()
    drop_after = config.drop_stream_after_chunks
    for index, chunk in enumerate(answer.chunks(include_usage=include_usage)):
        if drop_after is not None and index >= drop_after:
            raise _StreamDroppedError
        if 1 < index <= answer.piece_count:
            await _until(first_piece + (index - 1) * _piece_seconds(config))
        for part, write in enumerate(_writes(_sse(chunk), config.split_utf8)):
            if part:  # let the first half reach the client on its own
                await asyncio.sleep(config.split_pause_seconds)
            yield write
    if drop_after is not None:
        raise _StreamDroppedError
    yield b"data: [DONE]\n\n"


class SimulatedStream(StreamingResponse):
    """An SSE response that records how it ended and closes its generator as soon as it does."""

    def __init__(self, events: AsyncGenerator[bytes, None], stats: SimulatorStats, user: str = "") -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._events = events
        self._stats = stats
        self._user = user
        self._completed = False

    async def stream_response(self, send: Send) -> None:
        await super().stream_response(send)
        # Answered in full once the last byte is written: the response's task group (ASGI 2.3: the stream
        # and a disconnect listener) unwinds only some loop turns later, while a client that has read the end
        # may already have sent its next call; counting the stream until then would show two calls at once.
        self._completed = True
        self._stats.close_stream("completed", self._user)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._stats.streams_open += 1
        outcome = "cancelled"  # a client disconnect cancels the stream and returns quietly
        try:
            await super().__call__(scope, receive, send)
        except _StreamDroppedError:
            # Returning without the final body makes uvicorn close the connection mid-stream.
            outcome = "dropped"
        finally:
            if not self._completed:
                self._stats.close_stream(outcome, self._user)
            with anyio.CancelScope(shield=True):
                await self._events.aclose()


async def complete(answer: Answer, config: SimulatorConfig, stats: SimulatorStats, user: str = "") -> JSONResponse:
    """A non-streaming answer arrives when a stream of it would have ended."""
    try:
        await asyncio.sleep(config.ttft_seconds + _piece_seconds(config) * max(answer.piece_count - 1, 0))
    finally:
        stats.release(user)
    return JSONResponse(answer.completion())
