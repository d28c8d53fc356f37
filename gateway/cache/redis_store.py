"""A `ByteStore` over Redis, shared by every gateway replica.

The cache only saves work, so a failing Redis must cost as little as possible:
every redis, socket or timeout failure becomes `CacheStoreError` (callers serve
without the cache). The store calls Redis through a `RedisConnection`, usually the
process's shared one: after a timeout or a connection error its circuit skips Redis
for a back-off window, so a dead or frozen Redis adds no latency to each request.

The URL may hold a password: it is never put into messages or logs.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gateway.cache.base import CacheStoreError
from gateway.redis_client import REDIS_FAILURES, RedisConnection, RedisSkippedError

T = TypeVar("T")


class RedisBackedStore:
    """Calls to Redis through the circuit of `redis` (a shared `RedisConnection`, or a URL for a connection of
    the store's own); failures become `CacheStoreError`."""

    def __init__(
        self,
        redis: str | RedisConnection,
        *,
        timeout_seconds: float = 0.25,
        backoff_seconds: float = 1.0,
        health_check_interval: int = 30,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = RedisConnection.shared(
            redis,
            timeout_seconds=timeout_seconds,
            backoff_seconds=backoff_seconds,
            health_check_interval=health_check_interval,
            clock=clock,
        )
        self._client = self._redis.client

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._redis!r})"  # no URL: it may hold a password

    async def aclose(self) -> None:
        await self._redis.aclose()

    async def ping(self) -> bool:
        """Whether Redis answered last time; never waits on it (readiness reads this)."""
        return self._redis.known_up()

    async def _call(self, operation: str, command: Callable[[], Awaitable[T]]) -> T:
        """Run `command` through the circuit, translating failures."""
        try:
            return await self._redis.call(command)
        except RedisSkippedError as exc:
            raise CacheStoreError(f"redis {operation} skipped: {exc}") from exc
        except REDIS_FAILURES as exc:
            raise CacheStoreError(f"redis {operation} failed: {type(exc).__name__}: {exc}") from exc


class RedisStore(RedisBackedStore):
    """Keys and values as Redis strings; one MGET per lookup, one pipeline per write."""

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        if not keys:
            return []
        return await self._call("get", lambda: self._mget(keys))

    async def set_many(self, items: dict[str, bytes], ttl_seconds: int | None = None) -> None:
        if items:
            await self._call("set", lambda: self._pipelined_set(items, ttl_seconds))

    async def _mget(self, keys: list[str]) -> list[bytes | None]:
        values = await self._client.mget(keys)
        return [value if isinstance(value, bytes) else None for value in values]

    async def _pipelined_set(self, items: dict[str, bytes], ttl_seconds: int | None) -> None:
        async with self._client.pipeline(transaction=False) as pipe:
            for key, value in items.items():
                pipe.set(key, value, ex=ttl_seconds)
            await pipe.execute()
