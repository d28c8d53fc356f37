"""Watching one task: the task now, then at each visible change, ending with its final state.

Shared by every kind of task (video tasks, re-index jobs): the caller says how to read the task (raising 404 when
it is unknown), how to subscribe to its changes and what of it is visible to the client. Each change carries the task's
`version`, which the transports send as the event's id: a client that reconnects names the last it read, and
`resumed` leaves out what it has seen."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, aclosing

from gateway.errors import NotFoundError
from gateway.tasks.base import TaskChanges, TaskStoreError
from gateway.tasks.model import Task

WATCH_RECHECK_SECONDS = 2.0  # a watcher re-reads the task this often even without a notification


async def watch(
    read: Callable[[], Awaitable[Task]],
    subscribe: Callable[[], AbstractAsyncContextManager[TaskChanges]],
    visible: Callable[[Task], object],
) -> AsyncGenerator[Task, None]:
    """The changes of a task `read` finds (a 404 is raised here, before the stream starts)."""
    await read()
    return _changes(read, subscribe, visible)


async def _changes(
    read: Callable[[], Awaitable[Task]],
    subscribe: Callable[[], AbstractAsyncContextManager[TaskChanges]],
    visible: Callable[[Task], object],
) -> AsyncGenerator[Task, None]:
    async with subscribe() as changes:  # subscribed before the first read
        task = await read()
        yield task
        while not task.state.terminal:
            await changes.wait(WATCH_RECHECK_SECONDS)
            try:
                current = await read()
            except NotFoundError:
                return  # expired
            except TaskStoreError:
                continue  # the store is back soon or the task ends; keep watching
            if visible(current) != visible(task):
                yield current
            task = current


async def resumed(changes: AsyncGenerator[Task, None], after: int | None) -> AsyncGenerator[Task, None]:
    """`changes` without the versions up to `after`: a client that reconnects (SSE's `Last-Event-ID`, a socket's
    `last_event_id`) gets what changed since the last event it read (an event's id is its task's version), and a
    finished task it saw end gets no event at all. A version
    also moves on changes a watcher does not see (bookkeeping), so the first event after a resume may repeat the
    state the client has: events are snapshots, and a repeat is harmless."""
    async with aclosing(changes):
        async for task in changes:
            if after is None or task.version > after:
                yield task
