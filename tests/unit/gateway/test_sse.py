"""Server-sent events: one write per batch of payloads, [DONE] at a good end, an error as the last event."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator

from gateway import sse
from gateway.errors import UpstreamUnavailableError


async def collect(texts: AsyncGenerator[str, None]) -> list[str]:
    return [text async for text in texts]


async def test_each_batch_is_one_text_of_events_and_the_stream_ends_with_done() -> None:
    async def batches() -> AsyncGenerator[list[str], None]:
        yield ['{"n":1}']
        yield ['{"n":2}', '{"n":3}']

    texts = await collect(sse.encode_batches(batches()))
    assert texts == ['data: {"n":1}\n\n', 'data: {"n":2}\n\ndata: {"n":3}\n\n', sse.DONE]


async def test_an_error_after_the_first_batch_becomes_the_last_event_with_no_done() -> None:
    async def failing() -> AsyncGenerator[list[str], None]:
        yield ['{"n":1}']
        raise UpstreamUnavailableError("chat upstream unavailable")

    texts = await collect(sse.encode_batches(failing()))
    assert texts[0] == 'data: {"n":1}\n\n' and len(texts) == 2 and sse.DONE not in texts
    error = json.loads(texts[1].removeprefix("data: "))["error"]
    assert error["message"] == "chat upstream unavailable"


async def test_an_unexpected_failure_is_an_internal_error_event_with_no_done() -> None:
    async def failing() -> AsyncGenerator[list[str], None]:
        yield ['{"n":1}']
        raise RuntimeError("a bug")

    texts = await collect(sse.encode_batches(failing()))
    assert len(texts) == 2 and sse.DONE not in texts
    assert json.loads(texts[1].removeprefix("data: "))["error"]["message"] == "internal error"


async def test_identified_events_carry_their_ids_and_an_error_still_ends_the_stream() -> None:
    async def events() -> AsyncGenerator[tuple[int | str, str], None]:
        yield 3, '{"n":1}'
        yield 5, '{"n":2}'
        raise UpstreamUnavailableError("task store unavailable")

    texts = await collect(sse.encode_identified(events()))
    assert texts[:2] == ['id: 3\ndata: {"n":1}\n\n', 'id: 5\ndata: {"n":2}\n\n'] and sse.DONE not in texts
    assert json.loads(texts[2].removeprefix("data: "))["error"]["message"] == "task store unavailable"
