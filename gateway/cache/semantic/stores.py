"""Where the index keeps its entries: per context, (fingerprint, exact key) pairs, newest first.

`MemorySemanticStore` is per process; `RedisSemanticStore` is shared by every replica,
one Redis list per context holding entries in the `encode_entry` framing.
"""

from __future__ import annotations

import logging
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from gateway.cache.redis_store import RedisBackedStore
from gateway.redis_client import RedisConnection

log = logging.getLogger(__name__)

REDIS_PREFIX = "sem:v1:"
_LENGTH = struct.Struct("<H")  # entry framing: fingerprint length, fingerprint, answer key (UTF-8)


class SemanticEntry(NamedTuple):
    fingerprint: bytes
    answer_key: str


class SemanticStore(Protocol):
    async def entries(self, context: str) -> list[SemanticEntry]:
        """The context's entries, newest first; [] when none. Raises `CacheStoreError`."""
        ...

    async def add(self, context: str, entry: SemanticEntry, *, max_entries: int, ttl_seconds: int) -> None:
        """Put `entry` first, keep the newest `max_entries`, expire the context `ttl_seconds` after this write."""
        ...

    async def aclose(self) -> None: ...


class _Context(NamedTuple):
    entries: list[SemanticEntry]
    expires_at: float


class MemorySemanticStore:
    """In-process: context -> bounded list, newest first; the least recently used contexts go first."""

    def __init__(self, max_contexts: int = 10_000, *, clock: Callable[[], float] = time.monotonic) -> None:
        if max_contexts < 1:
            raise ValueError(f"max_contexts must be >= 1, got {max_contexts}")
        self.max_contexts = max_contexts
        self._clock = clock
        self._contexts: OrderedDict[str, _Context] = OrderedDict()

    def __len__(self) -> int:
        return len(self._contexts)

    async def entries(self, context: str) -> list[SemanticEntry]:
        held = self._contexts.get(context)
        if held is None:
            return []
        if held.expires_at <= self._clock():
            del self._contexts[context]
            return []
        self._contexts.move_to_end(context)
        return list(held.entries)

    async def add(self, context: str, entry: SemanticEntry, *, max_entries: int, ttl_seconds: int) -> None:
        entries = [entry, *await self.entries(context)][:max_entries]
        self._contexts[context] = _Context(entries, self._clock() + ttl_seconds)
        self._contexts.move_to_end(context)
        while len(self._contexts) > self.max_contexts:
            self._contexts.popitem(last=False)

    async def aclose(self) -> None:
        self._contexts.clear()


def encode_entry(entry: SemanticEntry) -> bytes:
    return _LENGTH.pack(len(entry.fingerprint)) + entry.fingerprint + entry.answer_key.encode("utf-8")


def decode_entry(data: bytes) -> SemanticEntry:
    """Inverse of `encode_entry`; raises ValueError on a malformed entry."""
    if len(data) < _LENGTH.size:
        raise ValueError(f"semantic entry of {len(data)} bytes is shorter than its {_LENGTH.size}-byte header")
    (length,) = _LENGTH.unpack_from(data)
    end = _LENGTH.size + length
    if len(data) <= end:
        raise ValueError(f"semantic entry of {len(data)} bytes has no answer key after a {length}-byte fingerprint")
    return SemanticEntry(data[_LENGTH.size : end], data[end:].decode("utf-8"))


class RedisSemanticStore(RedisBackedStore):
    """One Redis list per context (`sem:v1:<context>`), newest entry first, shared by every replica.

    A write is one pipeline (LPUSH, LTRIM, EXPIRE), a read one LRANGE, so an entry
    written by one replica is visible to the next read anywhere. Failures become
    `CacheStoreError`; like `RedisStore`, calls go through the circuit of its `RedisConnection`.
    """

    def __init__(self, redis: str | RedisConnection, timeout_seconds: float = 0.25, **options: Any) -> None:
        super().__init__(redis, timeout_seconds=timeout_seconds, **options)

    async def entries(self, context: str) -> list[SemanticEntry]:
        raw = await self._call("lrange", lambda: self._client.lrange(REDIS_PREFIX + context, 0, -1))
        found = []
        for item in raw:
            try:
                found.append(decode_entry(item if isinstance(item, bytes) else item.encode()))
            except ValueError:  # UnicodeDecodeError included
                log.warning("skipping a malformed semantic cache entry in context %s", context)
        return found

    async def add(self, context: str, entry: SemanticEntry, *, max_entries: int, ttl_seconds: int) -> None:
        await self._call(
            "push", lambda: self._push(REDIS_PREFIX + context, encode_entry(entry), max_entries, ttl_seconds)
        )

    async def _push(self, key: str, value: bytes, max_entries: int, ttl_seconds: int) -> None:
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.lpush(key, value)
            pipe.ltrim(key, 0, max_entries - 1)
            pipe.expire(key, ttl_seconds)
            await pipe.execute()
