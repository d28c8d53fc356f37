"""A `ByteStore` over Redis, shared by every gateway replica.

The cache only saves work, so a failing Redis must cost as little as possible:
every redis, socket or timeout failure becomes `CacheStoreError` (callers serve
without the cache), and after one failure calls fail fast, without touching the
network, for `backoff_seconds`, so a dead Redis adds no latency to each request.
The client comes from `gateway.redis_client` (bounded pool, one reconnect).

The URL may hold a password: it is never put into messages or logs.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gateway.cache.base import CacheStoreError
from gateway.redis_client import REDIS_FAILURES, redis_client

T = TypeVar("T")


class RedisBackedStore:
    """A Redis client that fails fast for `backoff_seconds` after a failure, so a dead Redis adds no
    latency to every request; failures become `CacheStoreError`."""

    def __init__(
        self,
        url: str,
        *,
        timeout_seconds: float = 0.25,
        backoff_seconds: float = 1.0,
        health_check_interval: int = 30,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = redis_client(url, timeout_seconds, health_check_interval)
        self.backoff_seconds = backoff_seconds
        self._clock = clock
        self._retry_at = float("-inf")  # on `clock`; before it, calls fail without the network

    def __repr__(self) -> str:
        return f"{type(self).__name__}(backoff_seconds={self.backoff_seconds})"  # no URL: it may hold a password

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _call(self, operation: str, command: Callable[[], Awaitable[T]]) -> T:
        """Run `command`, translating failures; fail fast while backing off after one."""
        wait = self._retry_at - self._clock()
        if wait > 0:
            raise CacheStoreError(f"redis {operation} skipped: backing off after a failure, {wait:.2f} s left")
        try:
            return await command()
        except REDIS_FAILURES as exc:
            self._retry_at = self._clock() + self.backoff_seconds
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

    async def ping(self) -> bool:
        return await self._call("ping", self._ping)

    async def _mget(self, keys: list[str]) -> list[bytes | None]:
        values = await self._client.mget(keys)
        return [value if isinstance(value, bytes) else None for value in values]

    async def _ping(self) -> bool:
        return bool(await self._client.ping())

    async def _pipelined_set(self, items: dict[str, bytes], ttl_seconds: int | None) -> None:
        async with self._client.pipeline(transaction=False) as pipe:
            for key, value in items.items():
                pipe.set(key, value, ex=ttl_seconds)
            await pipe.execute()
