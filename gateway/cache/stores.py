"""Choose the cache store from the settings: Redis when configured (shared by replicas), else memory."""

from __future__ import annotations

from gateway.cache.base import ByteStore
from gateway.cache.memory import MemoryStore
from gateway.cache.redis_store import RedisStore
from gateway.settings import CacheSettings


def build_store(settings: CacheSettings, *, memory_mb: float | None = None) -> ByteStore:
    """A `RedisStore` when `REDIS_URL` is set, else a `MemoryStore` of `memory_mb` (default `EMBEDDING_CACHE_MB`)."""
    if settings.redis_url is not None:
        return RedisStore(settings.redis_url.get_secret_value(), timeout_seconds=settings.redis_timeout_seconds)
    megabytes = settings.embedding_cache_mb if memory_mb is None else memory_mb
    return MemoryStore(int(megabytes * 1024 * 1024))
