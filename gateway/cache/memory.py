"""An in-process `ByteStore`: least recently used entries go first once a byte bound is reached.

Used when no Redis is configured. The bound is in bytes rather than entries because
a vector's size depends on the model's dimension; each entry is charged its key,
its value and a fixed overhead for the bookkeeping around them. The gateway runs
on one asyncio thread, so there are no locks.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

ENTRY_OVERHEAD_BYTES = 96  # dict slot, tuple, bytes and str headers: roughly what CPython spends per entry


class _Entry(NamedTuple):
    value: bytes
    expires_at: float | None  # on `clock`; None: kept until evicted
    size: int


class MemoryStore:
    """A byte-bounded LRU with optional per-item expiry; `max_bytes=0` stores nothing."""

    def __init__(self, max_bytes: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._clock = clock  # injectable so tests can move time without sleeping
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._used = 0

    @property
    def used_bytes(self) -> int:
        """Bytes charged for the entries held now (keys, values and overhead)."""
        return self._used

    def __len__(self) -> int:
        return len(self._entries)

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        now = self._clock()
        return [self._get(key, now) for key in keys]

    async def set_many(self, items: dict[str, bytes], ttl_seconds: int | None = None) -> None:
        expires_at = None if ttl_seconds is None else self._clock() + ttl_seconds
        for key, value in items.items():
            self._set(key, value, expires_at)

    async def ping(self) -> bool:
        return True

    async def aclose(self) -> None:
        self._entries.clear()
        self._used = 0

    def _get(self, key: str, now: float) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires_at is not None and entry.expires_at <= now:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry.value

    def _set(self, key: str, value: bytes, expires_at: float | None) -> None:
        self._drop(key)  # an oversized new value must not leave the old one readable
        size = len(key) + len(value) + ENTRY_OVERHEAD_BYTES
        if size > self.max_bytes:
            return
        self._evict_until_free(size)
        self._entries[key] = _Entry(value, expires_at, size)
        self._used += size

    def _evict_until_free(self, size: int) -> None:
        while self._used + size > self.max_bytes:
            _, oldest = self._entries.popitem(last=False)
            self._used -= oldest.size

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._used -= entry.size
