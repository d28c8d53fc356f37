"""Watching one task: the task now, then at each visible change, ending with its final state.

Shared by every kind of task (video tasks, re-index jobs): the caller says how to read the task (raising 404 when
it is unknown), how to subscribe to its changes and what of it is visible to the client."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager

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
