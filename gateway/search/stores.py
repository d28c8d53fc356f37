"""Choose the vector store from the settings: Milvus when SEARCH_MILVUS_URI is set, else the embedded one; none
when search is disabled. And the store of re-index jobs: Redis when configured, else SQLite under SEARCH_PATH."""

from __future__ import annotations

from pathlib import Path

from gateway.redis_client import RedisConnection
from gateway.search.embedded import EmbeddedStore
from gateway.search.milvus import MilvusStore
from gateway.search.store import VectorStore
from gateway.settings import SearchSettings
from gateway.tasks.base import TaskStore
from gateway.tasks.redis_store import RedisTaskStore
from gateway.tasks.sqlite_store import SqliteTaskStore

JOBS_KEY_PREFIX = "gateway:search-jobs:"  # apart from the video tasks, which their runner scans


def build_vector_store(settings: SearchSettings, redis: RedisConnection | None = None) -> VectorStore | None:
    """`redis` (the process's shared connection) carries each Milvus collection's last write timestamp to every
    replica, so a document is searchable from all of them when its upsert returns; without it, from this one."""
    if not settings.enabled:
        return None
    if settings.milvus_uri:
        return MilvusStore(
            settings.milvus_uri,
            settings.milvus_token,
            timeout_seconds=settings.timeout_seconds,
            max_threads=settings.max_threads,
            redis=redis,
            flush_after_rows=settings.milvus_flush_after_rows,
            flush_quiet_seconds=settings.milvus_flush_quiet_seconds,
            index=settings.milvus_index,
            hnsw_ef=settings.hnsw_ef,
        )
    return EmbeddedStore(settings.path, max_threads=settings.max_threads, hnsw_ef=settings.hnsw_ef)


def build_job_store(settings: SearchSettings, redis: RedisConnection | None) -> TaskStore:
    """Where re-index jobs live: shared by every replica through Redis, else a file beside the collections."""
    if redis is not None:
        return RedisTaskStore(redis, key_prefix=JOBS_KEY_PREFIX)
    return SqliteTaskStore(str(Path(settings.path) / "jobs.sqlite3"))
