"""Choose the cache store from the settings: Redis when configured (shared by replicas), else memory."""

from __future__ import annotations

from gateway.cache.base import ByteStore
from gateway.cache.memory import MemoryStore
from gateway.cache.redis_store import RedisStore
from gateway.redis_client import RedisConnection


def build_store(redis: RedisConnection | None, *, memory_mb: float) -> ByteStore:
    """A `RedisStore` on the shared connection when Redis is configured, else a `MemoryStore` of `memory_mb`."""
    if redis is not None:
        return RedisStore(redis)
    return MemoryStore(int(memory_mb * 1024 * 1024))
