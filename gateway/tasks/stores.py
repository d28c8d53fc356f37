"""Choose the task store: Redis when configured (shared by every replica), else SQLite on disk (one replica)."""

from __future__ import annotations

from gateway.redis_client import RedisConnection
from gateway.tasks.base import TaskStore
from gateway.tasks.redis_store import RedisTaskStore
from gateway.tasks.sqlite_store import SqliteTaskStore


def build_task_store(redis: str | RedisConnection | None, sqlite_path: str) -> TaskStore:
    """A `RedisTaskStore` when Redis is configured, else a `SqliteTaskStore` at `sqlite_path` (opened on first use)."""
    if redis is not None:
        return RedisTaskStore(redis)
    return SqliteTaskStore(sqlite_path)
