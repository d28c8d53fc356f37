"""Every change of a video task goes through `TaskLedger.change`: read, decide, compare-and-set, retry.

A webhook, a poller, a cancel and a timeout may all race on one task, on different replicas. Each
writer states its decision as a function of the current record; the ledger applies it with the
store's compare-and-set and, when another writer won, decides again on the fresh record. So the
outcome is the same whatever the order, and a terminal task is never changed again.

The ledger is the only door to the task store: the service and the runner's parts create, read, watch,
scan and lease tasks through it, so every write is counted once and nothing bypasses the compare-and-set.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from gateway import metrics
from gateway.errors import NotFoundError
from gateway.tasks.base import Lease, TaskChanges, TaskStore, TaskStoreError
from gateway.tasks.model import Task, TaskError, TaskState

MAX_CONFLICTS = 16

Decision = Callable[[Task], Task | None]  # the new record, or None to leave the task as it is


class TaskLedger:
    def __init__(self, store: TaskStore, *, retention_seconds: float, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self.retention_seconds = retention_seconds
        self.clock = clock

    async def create(self, task: Task, lease: Lease | None = None) -> tuple[Task, bool]:
        """Store a new pending task, with `lease` taken in the same step; `(the earlier task, False)` when its
        idempotency key names one (see `TaskStore.create`)."""
        stored, created = await self._store.create(task, lease)
        if created:
            self._count(stored)
        return stored, created

    async def get(self, task_id: str) -> Task:
        task = await self._store.get(task_id)
        if task is None:
            raise NotFoundError(f"task {task_id!r} not found (unknown, or expired after its retention)")
        return task

    async def change(
        self, task_id: str, decide: Decision, *, known: Task | None = None, lease: Lease | None = None
    ) -> tuple[Task, bool]:
        """Apply `decide` to the current record until it sticks; return the record and whether it changed.

        `known`: the record as the caller last read it, decided on first, which saves a read when nobody
        wrote in between. A stale one loses the compare-and-set, and "no change" is only trusted on a fresh read.
        `lease`: taken with the write that sticks, in the same step (see `TaskStore.save`); none without a write.
        """
        current = known
        for _ in range(MAX_CONFLICTS):
            fresh = current is None
            if current is None:
                current = await self.get(task_id)
            new = decide(current)
            if new is None:
                if fresh:
                    return current, False
            elif await self._store.save(new, lease):
                if new.state != current.state:
                    self._count(new)
                return new, True
            current = None
        raise TaskStoreError(f"task {task_id}: {MAX_CONFLICTS} conflicting writes in a row")

    def changes(self, task_id: str) -> AbstractAsyncContextManager[TaskChanges]:
        """Subscribe to changes of one task, for as long as the context is open."""
        return self._store.changes(task_id)

    async def due(self, now: float, limit: int) -> list[Task]:
        """The unfinished tasks due by `now` (`Task.due_at`), earliest first, at most `limit`."""
        return await self._store.due(now, limit)

    async def count_unfinished(self) -> dict[TaskState, int]:
        return await self._store.count_unfinished()

    async def acquire_lease(self, lease: Lease) -> bool:
        """Take or extend `lease` for its owner; False while another owner holds it."""
        return await self._store.acquire_lease(lease.name, lease.owner, lease.ttl_seconds)

    async def release_lease(self, lease: Lease) -> None:
        await self._store.release_lease(lease.name, lease.owner)

    async def purge_expired(self) -> int:
        """Delete the tasks whose retention has passed (and expired leases); how many tasks."""
        return await self._store.purge_expired(self.clock())

    async def ping(self) -> bool:
        return await self._store.ping()

    def ended(self, task: Task, state: TaskState, **changes: Any) -> Task:
        """`task` moved to the terminal `state` now, with its expiry set from the retention."""
        now = self.clock()
        return task.moved(state, now, ended_at=now, expires_at=now + self.retention_seconds, **changes)

    def failed(self, task: Task, code: str, message: str, **changes: Any) -> Task:
        error = TaskError(code, message)
        return self.ended(task, TaskState.FAILED, error=error, next_attempt_at=None, poll_after=None, **changes)

    def _count(self, task: Task) -> None:
        metrics.VIDEO_TASK_TRANSITIONS.labels(state=task.state.value).inc()
        if task.state.terminal and task.ended_at is not None:
            metrics.VIDEO_TASK_DURATION.labels(state=task.state.value).observe(task.ended_at - task.created_at)
            if task.completed_by == "polling":
                metrics.VIDEO_TASKS_COMPLETED_BY_POLLING.inc()
