"""Server-sent events: each event is `data: <json>\n\n`, the stream always ends with `data: [DONE]\n\n`.

After the headers have gone out an error can no longer change the status, so it
is sent as a final `data: {"error": ...}` event, still followed by [DONE].
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing

from gateway.errors import GatewayError, error_body

DONE = "data: [DONE]\n\n"
MEDIA_TYPE = "text/event-stream"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering between us and the client
log = logging.getLogger(__name__)


def event(data: str) -> str:
    return f"data: {data}\n\n"


async def encode_stream(payloads: AsyncGenerator[str, None]) -> AsyncGenerator[str, None]:
    """`payloads` (JSON texts) as SSE events; an error mid-stream becomes an error event."""
    try:
        async with aclosing(payloads):  # a client that goes away closes the source, and so the upstream call
            async for payload in payloads:
                yield event(payload)
    except GatewayError as exc:
        yield event(json.dumps(exc.body(), ensure_ascii=False))
    except Exception:
        log.exception("stream failed")
        yield event(json.dumps(error_body("internal error", GatewayError.type)))
    yield DONE
