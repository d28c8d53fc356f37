"""A chat stream's chunks passed on as they come, its usage recorded and its key's reservation settled when it
ends: the same for the REST stream and the gRPC one."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AsyncExitStack, aclosing
from typing import Any

from gateway.keys.gatekeeper import ChatReservation
from gateway.usage.record import Usage, chat_usage


async def metered_stream(
    events: AsyncGenerator[list[str], None],
    *,
    cached: bool,
    usage_requested: bool,
    reservation: ChatReservation,
    held: AsyncExitStack,
    record: Callable[[Usage], Awaitable[object]],
) -> AsyncGenerator[list[str], None]:
    """`events`' batches; the chunk with a `usage` (the last: the gateway always asks the upstream for it) is
    what is recorded. That usage-only chunk (no choices) goes on to the client only if it asked for it
    (`usage_requested`), as OpenAI's streams do. `held` (the key's tokens and stream slot) is released when the
    stream ends or the client goes."""
    usage: dict[str, Any] | None = None
    try:
        async with aclosing(events):
            async for batch in events:
                passed = []
                for chunk in batch:
                    if '"usage"' in chunk and (found := json.loads(chunk)).get("usage"):
                        usage = found["usage"]
                        if not usage_requested and not found.get("choices"):
                            continue  # asked for by the gateway, not by the client
                    passed.append(chunk)
                if passed:
                    yield passed
        recorded = chat_usage(usage, cached=cached)
        if usage is not None or cached:  # a stream without usage (an upstream that ignored it) keeps its estimate
            reservation.settle(recorded.prompt_tokens + recorded.completion_tokens)
        await record(recorded)  # before the stream's end ([DONE]) goes out: an answer received is on record
    finally:
        await held.aclose()
