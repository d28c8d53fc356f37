"""A task's event stream (server-sent events): one event per visible change, then [DONE]. Video tasks and
re-index jobs answer their `.../events` routes with it; `gateway.limits.is_task_watch` gives them the watchers'
permits. Each event's id is its task's version: a client that reconnects sends the last as `Last-Event-ID`, and
the video routes resume after it (`resume_point`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

from fastapi.responses import StreamingResponse

from gateway import sse
from gateway.services.video import Task

MAX_ID_DIGITS = 19  # a task's version counts its changes: none of our ids is longer than a 64-bit integer
EVENTS_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {sse.MEDIA_TYPE: {}},
        "description": "One event per change (its id: the task's version), then [DONE].",
    }
}


def task_events(changes: AsyncGenerator[Task, None], render: Callable[[Task], str]) -> StreamingResponse:
    """`changes` as events, each task rendered as its JSON object by `render`."""
    events = sse.with_heartbeats(sse.encode_identified(_rendered(changes, render)))
    return StreamingResponse(events, media_type=sse.MEDIA_TYPE, headers=sse.HEADERS)


async def _rendered(
    tasks: AsyncGenerator[Task, None], render: Callable[[Task], str]
) -> AsyncGenerator[tuple[int, str], None]:
    async with aclosing(tasks):
        async for task in tasks:
            yield task.version, render(task)


def resume_point(last_event_id: str | None) -> int | None:
    """The version a reconnecting client read last (SSE's `Last-Event-ID`, a socket's `last_event_id`); None for
    none, and for a value that is not one of our ids: the client then gets the task as it is now, as a new watcher
    would (an EventSource would retry a refusal for ever)."""
    text = (last_event_id or "").strip()
    if len(text) > MAX_ID_DIGITS:  # not ours, and past Python's limit on int() (4,300 digits) a ValueError
        return None
    return int(text) if text.isascii() and text.isdigit() else None
