"""Choose the task store: Redis when configured (shared by every replica), else SQLite on disk (one replica)."""

from __future__ import annotations

from gateway.tasks.base import TaskStore
from gateway.tasks.redis_store import RedisTaskStore
from gateway.tasks.sqlite_store import SqliteTaskStore


def build_task_store(redis_url: str | None, sqlite_path: str) -> TaskStore:
    """A `RedisTaskStore` when `redis_url` is set, else a `SqliteTaskStore` at `sqlite_path` (opened on first use)."""
    if redis_url is not None:
        return RedisTaskStore(redis_url)
    return SqliteTaskStore(sqlite_path)
