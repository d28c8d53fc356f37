"""MemoryStore: byte-bounded LRU eviction and expiry, on a clock the tests move by hand."""

from __future__ import annotations

import pytest

from gateway.cache.memory import ENTRY_OVERHEAD_BYTES, MemoryStore


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def size_of(key: str, value: bytes) -> int:
    return len(key) + len(value) + ENTRY_OVERHEAD_BYTES


async def get(store: MemoryStore, *keys: str) -> list[bytes | None]:
    return await store.get_many(list(keys))


async def put(store: MemoryStore, items: dict[str, bytes], ttl_seconds: int | None = None) -> None:
    await store.set_many(items, ttl_seconds)


async def test_round_trip_in_order_with_none_for_missing_keys() -> None:
    store = MemoryStore(1 << 20)
    await put(store, {"a": b"1", "b": b"\x00\xff", "empty": b""})
    assert await get(store, "b", "missing", "a", "empty") == [b"\x00\xff", None, b"1", b""]


async def test_overwrite_replaces_value_and_charge() -> None:
    store = MemoryStore(1 << 20)
    await put(store, {"k": b"short"})
    await put(store, {"k": b"a longer value"})
    assert await get(store, "k") == [b"a longer value"]
    assert store.used_bytes == size_of("k", b"a longer value")
    assert len(store) == 1


async def test_least_recently_used_entry_goes_first() -> None:
    value = b"x" * 100
    store = MemoryStore(2 * size_of("a", value))
    await put(store, {"a": value, "b": value})
    assert await get(store, "a") == [value]  # "a" is now the most recently used
    await put(store, {"c": value})
    assert await get(store, "a", "b", "c") == [value, None, value]
    assert store.used_bytes <= store.max_bytes


async def test_eviction_frees_enough_bytes_for_a_large_value() -> None:
    store = MemoryStore(3 * size_of("a", b"x"))
    await put(store, {"a": b"x", "b": b"x", "c": b"x"})
    big = b"y" * (size_of("a", b"x") + 1)  # needs the room of two small entries
    await put(store, {"d": big})
    assert await get(store, "a", "b", "c", "d") == [None, None, b"x", big]
    assert store.used_bytes == size_of("c", b"x") + size_of("d", big)


async def test_value_above_the_bound_is_not_stored_and_evicts_nothing() -> None:
    store = MemoryStore(500)
    await put(store, {"small": b"s"})
    await put(store, {"huge": b"h" * 500})
    assert await get(store, "small", "huge") == [b"s", None]


async def test_oversized_overwrite_drops_the_old_value() -> None:
    store = MemoryStore(500)
    await put(store, {"k": b"old"})
    await put(store, {"k": b"h" * 500})
    assert await get(store, "k") == [None]
    assert store.used_bytes == 0


async def test_zero_bytes_stores_nothing() -> None:
    store = MemoryStore(0)
    await put(store, {"a": b""})
    assert await get(store, "a") == [None]
    assert len(store) == 0


def test_negative_bound_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_bytes must be >= 0, got -1"):
        MemoryStore(-1)


async def test_expired_entries_read_as_absent_and_are_dropped() -> None:
    clock = ManualClock()
    store = MemoryStore(1 << 20, clock=clock)
    await put(store, {"short": b"1"}, ttl_seconds=10)
    await put(store, {"forever": b"2"})
    clock.now += 9.9
    assert await get(store, "short", "forever") == [b"1", b"2"]
    clock.now += 0.1
    assert await get(store, "short", "forever") == [None, b"2"]
    assert len(store) == 1
    assert store.used_bytes == size_of("forever", b"2")


async def test_rewriting_an_entry_renews_its_lifetime() -> None:
    clock = ManualClock()
    store = MemoryStore(1 << 20, clock=clock)
    await put(store, {"k": b"1"}, ttl_seconds=10)
    clock.now += 8
    await put(store, {"k": b"1"}, ttl_seconds=10)
    clock.now += 8
    assert await get(store, "k") == [b"1"]


async def test_ping_and_aclose() -> None:
    store = MemoryStore(1 << 20)
    await put(store, {"k": b"1"})
    assert await store.ping() is True
    await store.aclose()
    assert store.used_bytes == 0
    assert await get(store, "k") == [None]
