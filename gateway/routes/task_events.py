"""A task's event stream (server-sent events): one event per visible change, then [DONE]. Video tasks and
re-index jobs answer their `.../events` routes with it; `gateway.limits.is_task_watch` gives them the watchers'
permits."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

from fastapi.responses import StreamingResponse

from gateway import sse
from gateway.services.video import Task

EVENTS_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {"content": {sse.MEDIA_TYPE: {}}, "description": "One event per change, then [DONE]."}
}


def task_events(changes: AsyncGenerator[Task, None], render: Callable[[Task], str]) -> StreamingResponse:
    """`changes` as events, each task rendered as its JSON object by `render`."""
    events = sse.with_heartbeats(sse.encode_stream(_rendered(changes, render)))
    return StreamingResponse(events, media_type=sse.MEDIA_TYPE, headers=sse.HEADERS)


async def _rendered(tasks: AsyncGenerator[Task, None], render: Callable[[Task], str]) -> AsyncGenerator[str, None]:
    async with aclosing(tasks):
        async for task in tasks:
            yield render(task)
