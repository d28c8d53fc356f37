"""MemoryStore: byte-bounded LRU eviction and expiry, on a clock the tests move by hand."""

from __future__ import annotations

import asyncio

import pytest

from gateway.cache.memory import ENTRY_OVERHEAD_BYTES, MemoryStore


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def size_of(key: str, value: bytes) -> int:
    return len(key) + len(value) + ENTRY_OVERHEAD_BYTES


def get(store: MemoryStore, *keys: str) -> list[bytes | None]:
    return asyncio.run(store.get_many(list(keys)))


def put(store: MemoryStore, items: dict[str, bytes], ttl_seconds: int | None = None) -> None:
    asyncio.run(store.set_many(items, ttl_seconds))


def test_round_trip_in_order_with_none_for_missing_keys() -> None:
    store = MemoryStore(1 << 20)
    put(store, {"a": b"1", "b": b"\x00\xff", "empty": b""})
    assert get(store, "b", "missing", "a", "empty") == [b"\x00\xff", None, b"1", b""]


def test_overwrite_replaces_value_and_charge() -> None:
    store = MemoryStore(1 << 20)
    put(store, {"k": b"short"})
    put(store, {"k": b"a longer value"})
    assert get(store, "k") == [b"a longer value"]
    assert store.used_bytes == size_of("k", b"a longer value")
    assert len(store) == 1


def test_least_recently_used_entry_goes_first() -> None:
    value = b"x" * 100
    store = MemoryStore(2 * size_of("a", value))
    put(store, {"a": value, "b": value})
    assert get(store, "a") == [value]  # "a" is now the most recently used
    put(store, {"c": value})
    assert get(store, "a", "b", "c") == [value, None, value]
    assert store.used_bytes <= store.max_bytes


def test_eviction_frees_enough_bytes_for_a_large_value() -> None:
    store = MemoryStore(3 * size_of("a", b"x"))
    put(store, {"a": b"x", "b": b"x", "c": b"x"})
    big = b"y" * (size_of("a", b"x") + 1)  # needs the room of two small entries
    put(store, {"d": big})
    assert get(store, "a", "b", "c", "d") == [None, None, b"x", big]
    assert store.used_bytes == size_of("c", b"x") + size_of("d", big)


def test_value_above_the_bound_is_not_stored_and_evicts_nothing() -> None:
    store = MemoryStore(500)
    put(store, {"small": b"s"})
    put(store, {"huge": b"h" * 500})
    assert get(store, "small", "huge") == [b"s", None]


def test_oversized_overwrite_drops_the_old_value() -> None:
    store = MemoryStore(500)
    put(store, {"k": b"old"})
    put(store, {"k": b"h" * 500})
    assert get(store, "k") == [None]
    assert store.used_bytes == 0


def test_zero_bytes_stores_nothing() -> None:
    store = MemoryStore(0)
    put(store, {"a": b""})
    assert get(store, "a") == [None]
    assert len(store) == 0


def test_negative_bound_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_bytes must be >= 0, got -1"):
        MemoryStore(-1)


def test_expired_entries_read_as_absent_and_are_dropped() -> None:
    clock = ManualClock()
    store = MemoryStore(1 << 20, clock=clock)
    put(store, {"short": b"1"}, ttl_seconds=10)
    put(store, {"forever": b"2"})
    clock.now += 9.9
    assert get(store, "short", "forever") == [b"1", b"2"]
    clock.now += 0.1
    assert get(store, "short", "forever") == [None, b"2"]
    assert len(store) == 1
    assert store.used_bytes == size_of("forever", b"2")


def test_rewriting_an_entry_renews_its_lifetime() -> None:
    clock = ManualClock()
    store = MemoryStore(1 << 20, clock=clock)
    put(store, {"k": b"1"}, ttl_seconds=10)
    clock.now += 8
    put(store, {"k": b"1"}, ttl_seconds=10)
    clock.now += 8
    assert get(store, "k") == [b"1"]


def test_ping_and_aclose() -> None:
    store = MemoryStore(1 << 20)
    put(store, {"k": b"1"})
    assert asyncio.run(store.ping()) is True
    asyncio.run(store.aclose())
    assert store.used_bytes == 0
    assert get(store, "k") == [None]
