"""Choose the cache store from the settings: Redis when configured (shared by replicas), else memory."""

from __future__ import annotations

from gateway.cache.base import ByteStore
from gateway.cache.memory import MemoryStore
from gateway.cache.redis_store import RedisStore
from gateway.settings import CacheSettings


def build_store(settings: CacheSettings) -> ByteStore:
    """A `RedisStore` when `REDIS_URL` is set, else a `MemoryStore` bounded by `EMBEDDING_CACHE_MB`."""
    if settings.redis_url is not None:
        return RedisStore(settings.redis_url.get_secret_value(), timeout_seconds=settings.redis_timeout_seconds)
    return MemoryStore(int(settings.embedding_cache_mb * 1024 * 1024))
