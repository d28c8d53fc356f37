"""Server-sent events: each event is `data: <json>\n\n`; a stream that ends well ends with `data: [DONE]\n\n`.

After the headers have gone out an error can no longer change the status, so it is sent as a final
`data: {"error": ...}` event and the stream ends there, without [DONE]: a client that reads to [DONE] (the
official `openai` client does) cannot take a cut answer for a finished one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing

from gateway.errors import GatewayError, error_body

DONE = "data: [DONE]\n\n"
HEARTBEAT = ": keep-alive\n\n"  # an SSE comment: clients ignore it, proxies see traffic
MEDIA_TYPE = "text/event-stream"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering between us and the client
log = logging.getLogger(__name__)


def event(data: str) -> str:
    return f"data: {data}\n\n"


def identified(event_id: int | str, data: str) -> str:
    """An event with its id: a client that reconnects sends the last id it read as `Last-Event-ID`."""
    return f"id: {event_id}\ndata: {data}\n\n"


async def encode_batches(batches: AsyncGenerator[list[str], None]) -> AsyncGenerator[str, None]:
    """Each batch of payloads (JSON texts) as one text of SSE events (one write), then [DONE]; an error
    mid-stream becomes the last event, with no [DONE] after it."""
    try:
        async with aclosing(batches):  # a client that goes away closes the source, and so the upstream call
            async for batch in batches:
                yield "".join(map(event, batch))
    except Exception as exc:
        yield failure(exc)
        return
    yield DONE


async def encode_identified(events: AsyncGenerator[tuple[int | str, str], None]) -> AsyncGenerator[str, None]:
    """(id, payload) pairs as SSE events with their ids, then [DONE]; an error mid-stream becomes the last event."""
    try:
        async with aclosing(events):
            async for event_id, payload in events:
                yield identified(event_id, payload)
    except Exception as exc:
        yield failure(exc)
        return
    yield DONE


def failure(exc: Exception) -> str:
    """The last event of a stream that failed: the error's body (a bug's is "internal error", and is logged)."""
    if isinstance(exc, GatewayError):
        return event(json.dumps(exc.body(), ensure_ascii=False))
    log.error("stream failed", exc_info=exc)
    return event(json.dumps(error_body("internal error", GatewayError.type)))


async def with_heartbeats(events: AsyncGenerator[str, None], interval: float = 15.0) -> AsyncGenerator[str, None]:
    """`events`, plus a comment whenever none went out for `interval` s, so proxies keep an idle stream open."""
    async with aclosing(events):
        pending = asyncio.ensure_future(anext(events))
        try:
            while True:
                done, _ = await asyncio.wait({pending}, timeout=interval)
                if not done:
                    yield HEARTBEAT
                    continue
                try:
                    item = pending.result()
                except StopAsyncIteration:
                    return
                yield item
                pending = asyncio.ensure_future(anext(events))
        finally:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)  # the source must be idle before it is closed
