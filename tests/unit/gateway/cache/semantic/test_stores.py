"""The in-memory semantic store (expiry, bounded contexts) and the entry framing the Redis store writes."""

from __future__ import annotations

import pytest

from gateway.cache.semantic.stores import MemorySemanticStore, SemanticEntry, decode_entry, encode_entry


def test_entry_framing_round_trips_and_rejects_truncated_entries() -> None:
    entry = SemanticEntry(b"\x00\x01\xff" * 5, "chat:v1:abc")
    assert decode_entry(encode_entry(entry)) == entry
    with pytest.raises(ValueError):
        decode_entry(encode_entry(entry)[:10])
    with pytest.raises(ValueError):
        decode_entry(b"\x01")


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_memory_store_expires_contexts_and_bounds_their_number() -> None:
    clock = ManualClock()
    store = MemorySemanticStore(max_contexts=2, clock=clock)
    entry = SemanticEntry(b"f", "k")

    for context in ("a", "b", "c"):
        await store.add(context, entry, max_entries=5, ttl_seconds=10)
    found = [await store.entries(c) for c in ("a", "b", "c")]
    clock.now += 10
    assert [*found, await store.entries("c")] == [[], [entry], [entry], []]
