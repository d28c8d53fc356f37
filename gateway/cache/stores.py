"""Choose the cache store from the settings: Redis when configured (shared by replicas), else memory."""

from __future__ import annotations

from gateway.cache.base import ByteStore
from gateway.cache.memory import MemoryStore
from gateway.cache.redis_store import RedisStore
from gateway.settings import RedisSettings


def build_store(redis: RedisSettings, *, memory_mb: float) -> ByteStore:
    """A `RedisStore` when `REDIS_URL` is set, else a `MemoryStore` of `memory_mb`."""
    url = redis.url_value()
    if url is not None:
        return RedisStore(url, timeout_seconds=redis.timeout_seconds)
    return MemoryStore(int(memory_mb * 1024 * 1024))
