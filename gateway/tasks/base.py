"""The task store interface, and the in-process change notifier both stores use.

Two implementations: `SqliteTaskStore` (embedded default, one process, durable on disk) and
`RedisTaskStore` (shared by every replica; changes are announced over pub/sub, so a watcher on one
replica sees a change made on another).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

from gateway.errors import UpstreamUnavailableError
from gateway.tasks.model import Task, TaskState

PURGE_EVERY_SECONDS = 60.0  # how often a replica deletes the tasks past their retention


class TaskStoreError(UpstreamUnavailableError):
    """The task store (Redis or SQLite) could not be reached or answered a malformed record, or a task met too
    many conflicting writes in a row: video and re-index task operations answer 503, embeddings and chat go
    on.

    Do: client: retry later; operator: the log line's detail names the failure (Redis: reachable, `maxmemory`;
    SQLite: the volume mounted, writable, not full, used by one process).

    The driver's exception goes in `detail`, for the log only.
    """

    code = "task_store_unavailable"


class TaskChanges(Protocol):
    async def wait(self, timeout: float) -> bool:
        """Return True as soon as the task may have changed since the last call, False after `timeout` s."""
        ...


@dataclass(frozen=True)
class Lease:
    name: str
    owner: str
    ttl_seconds: float


class TaskStore(Protocol):
    async def create(self, task: Task, lease: Lease | None = None) -> tuple[Task, bool]:
        """Store a new task (version 0) and return `(task, True)`. If `task.idempotency_key` is already
        held by a stored task, store nothing and return `(that task, False)` (atomic across replicas).
        `lease`: taken for its owner together with the new task (in the same atomic step), so the replica
        that accepts a task can go on to submit it without another round trip; not taken when nothing is stored."""
        ...

    async def get(self, task_id: str) -> Task | None:
        """The task, or None when it never existed or has expired."""
        ...

    async def save(self, task: Task, lease: Lease | None = None) -> bool:
        """Compare-and-set: write `task` only if the stored version is `task.version - 1`, then announce
        the change to watchers. False when another writer got there first (re-read and decide again) or
        the task is gone. A terminal task gets its `expires_at` as expiry.
        `lease`: taken (or extended) for its owner in the same atomic step when the write sticks, as
        `acquire_lease` would (left alone while another owner holds it; the write stands either way), so a
        write and a claim that goes with it cost one round trip."""
        ...

    async def due(self, now: float, limit: int | None = None) -> list[Task]:
        """The pending and processing tasks with `due_at <= now` (earliest first, at most `limit`): what a
        scanner must act on. `due(math.inf)` is every unfinished task (what a restarted replica picks up)."""
        ...

    async def count_unfinished(self) -> dict[TaskState, int]:
        """How many tasks are pending and processing, without reading them."""
        ...

    async def acquire_lease(self, name: str, owner: str, ttl_seconds: float) -> bool:
        """Take the lease `name` for `owner` for `ttl_seconds`, or extend it if `owner` holds it already.
        False while another owner holds an unexpired one."""
        ...

    async def release_lease(self, name: str, owner: str) -> None:
        """Give the lease up if `owner` holds it (an expired or foreign one is left alone)."""
        ...

    def changes(self, task_id: str) -> AbstractAsyncContextManager[TaskChanges]:
        """Subscribe to changes of one task, for as long as the context is open."""
        ...

    async def purge_expired(self, now: float) -> int:
        """Delete tasks whose `expires_at` has passed (with their idempotency keys) and expired leases;
        return how many tasks."""
        ...

    async def ping(self) -> bool:
        """True when the store answers (readiness)."""
        ...

    async def aclose(self) -> None: ...


class _Subscription:
    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            return False
        self._event.clear()
        return True


class ChangeNotifier:
    """Wakes the watchers of a task in this process. Cheap when nobody watches."""

    def __init__(self) -> None:
        self._watchers: dict[str, set[_Subscription]] = {}

    def notify(self, task_id: str) -> None:
        for subscription in self._watchers.get(task_id, ()):
            subscription.notify()

    @asynccontextmanager
    async def subscribe(self, task_id: str) -> AsyncIterator[TaskChanges]:
        subscription = _Subscription()
        self._watchers.setdefault(task_id, set()).add(subscription)
        try:
            yield subscription
        finally:
            watchers = self._watchers.get(task_id)
            if watchers is not None:
                watchers.discard(subscription)
                if not watchers:
                    del self._watchers[task_id]
