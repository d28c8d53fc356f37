"""The Milvus store against Milvus standalone: read-your-writes from every replica without Strong's wait on each
read, the read level each Redis state gives, and bulk writes flushed into indexed segments once they go quiet."""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from pymilvus import MilvusClient

from gateway.search.analyzer import analyze
from gateway.search.documents import Collection
from gateway.search.milvus import MilvusStore
from gateway.search.milvus_clock import BOUNDED, STRONG, ReadLevel, WriteClock
from gateway.search.milvus_rows import milvus_name
from gateway.search.store import DocumentWrite
from tests.helpers.milvus_fixtures import MilvusStandalone, milvus_server  # noqa: F401 (a fixture)
from tests.helpers.redis_fixtures import RedisServer

pytestmark = pytest.mark.slow

DIMENSIONS = 8


def unit(seed: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    vector = np.random.default_rng(seed).standard_normal(DIMENSIONS).astype(np.float32)
    return vector / np.linalg.norm(vector)


def collection() -> Collection:
    return Collection(f"c-{uuid.uuid4().hex[:8]}", "model", "rev1", DIMENSIONS, 1_700_000_000, None, {})


async def test_what_one_replica_writes_another_reads_at_once(
    milvus_server: MilvusStandalone,  # noqa: F811
    redis_url: str,
) -> None:
    """Two stores are two replicas sharing Milvus and Redis: the collection, each upsert and each delete made
    through one is seen by the very next read through the other."""
    created = collection()

    writer = MilvusStore(milvus_server.uri, None, timeout_seconds=30, redis=redis_url)
    reader = MilvusStore(milvus_server.uri, None, timeout_seconds=30, redis=redis_url)
    try:
        await writer.create_collection(created)
        assert (await reader.collection(created.name)).name == created.name
        for n in range(5):
            await writer.upsert(
                created.name, [DocumentWrite(f"d{n}", f"text {n}", {"n": n}, unit(n), analyze(f"text {n}"))], now=n
            )
            hits = await reader.search(created.name, unit(n), 1, None, None)
            assert [hit.id for hit in hits] == [f"d{n}"]
        assert await writer.delete_documents(created.name, ["d4"]) == 1
        assert await reader.get_documents(created.name, ["d4"]) == []
        assert "d4" not in [hit.id for hit in await reader.search(created.name, unit(4), 5, None, None)]
        await writer.delete_collection(created.name)
        assert created.name not in [c.name for c in await reader.list_collections()]
    finally:
        await writer.aclose()
        await reader.aclose()


async def test_a_search_of_a_collection_not_written_just_now_does_not_wait_for_a_time_tick(
    milvus_server: MilvusStandalone,  # noqa: F811
    redis_url: str,
) -> None:
    """Strong waits for Milvus's next time tick (200 ms) on every search; these searches wait for none."""
    created = collection()
    client = MilvusClient(uri=milvus_server.uri)

    async def timed(search: Callable[[], Awaitable[object]]) -> float:
        took = []
        for _ in range(9):
            started = time.perf_counter()
            await search()
            took.append(time.perf_counter() - started)
        return statistics.median(took)

    async def strong_search() -> object:
        target = milvus_name(created.name)
        return client.search(target, data=[unit(1).tolist()], limit=1, consistency_level="Strong")

    store = MilvusStore(milvus_server.uri, None, timeout_seconds=30, redis=redis_url)
    try:
        await store.create_collection(created)
        await store.upsert(created.name, [DocumentWrite("a", "alpha", {}, unit(1), analyze("alpha"))], now=1)
        await asyncio.sleep(0.5)  # a few time ticks: Milvus has applied the write
        ours = await timed(lambda: store.search(created.name, unit(1), 1, None, None))
        strong = await timed(strong_search)
        assert ours < 0.06 and strong > ours, (ours, strong)
    finally:
        await store.aclose()
        client.close()


async def test_the_read_level_follows_the_last_write_shared_through_redis(own_redis: RedisServer) -> None:
    first, second = (
        WriteClock(own_redis.url, "http://milvus:19530"),
        WriteClock(own_redis.url, "http://milvus:19530"),
    )
    elsewhere = WriteClock(own_redis.url, "http://other-milvus:19530")
    alone = WriteClock(None, "http://milvus:19530", startup_seconds=0.2)
    short = WriteClock(None, "m", window_seconds=0.2, startup_seconds=0)
    try:
        assert await second.level("gw_x") == BOUNDED  # nothing written: no wait at all
        await first.wrote("gw_x", 470960052065009670)
        await second.wrote("gw_x", 470960052065009669)  # a write returning later never moves it back
        assert await second.level("gw_x") == ReadLevel("Customized", 470960052065009670)
        await second.wrote("gw_x", 470960052065009671)  # one more than a Lua number can tell apart
        assert await first.level("gw_x") == ReadLevel("Customized", 470960052065009671)
        assert ReadLevel("Customized", 500).options() == {
            "consistency_level": "Customized",
            "guarantee_timestamp": 500,
        }
        assert await second.level("gw_y") == BOUNDED
        assert await elsewhere.level("gw_x") == BOUNDED  # another server's timestamps are no guarantee here
        assert await alone.level("gw_x") == STRONG  # without Redis, at first: a process before may have written
        await alone.wrote("gw_x", 700)
        assert await alone.level("gw_x") == ReadLevel("Customized", 700)  # then its own writes alone
        await asyncio.sleep(0.2)
        assert await alone.level("gw_y") == BOUNDED
        await short.wrote("gw_x", 700)
        await asyncio.sleep(0.3)
        assert await short.level("gw_x") == BOUNDED  # past the window the write is older than Bounded's lag
        own_redis.stop()
        assert await second.level("gw_x") == STRONG  # Redis down: slower, never stale
        await first.wrote("gw_x", 900)  # and a write still succeeds
        assert await first.level("gw_x") == STRONG
    finally:
        for clock in (first, second, elsewhere, alone, short):
            await clock.aclose()


async def test_with_redis_down_the_store_still_writes_and_finds(
    milvus_server: MilvusStandalone,  # noqa: F811
    own_redis: RedisServer,
) -> None:
    created = collection()

    store = MilvusStore(milvus_server.uri, None, timeout_seconds=30, redis=own_redis.url)
    try:
        await store.create_collection(created)
        own_redis.stop()
        await store.upsert(created.name, [DocumentWrite("a", "alpha", {}, unit(1), analyze("alpha"))], now=1)
        assert [hit.id for hit in await store.search(created.name, unit(1), 1, None, None)] == ["a"]
    finally:
        await store.aclose()


async def test_a_bulk_upsert_is_sealed_and_indexed_once_writes_go_quiet_and_small_writes_are_not(
    milvus_server: MilvusStandalone,  # noqa: F811
) -> None:
    small, bulk = collection(), collection()
    client = MilvusClient(uri=milvus_server.uri)
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((1200, DIMENSIONS)).astype(np.float32)
    writes = [
        DocumentWrite(str(n), "t", {}, vectors[n] / np.linalg.norm(vectors[n]), analyze("t")) for n in range(1200)
    ]

    def segment_states(target: str) -> list[str]:
        return sorted(segment.state_name for segment in client.list_persistent_segments(target))

    store = MilvusStore(milvus_server.uri, None, timeout_seconds=30, flush_after_rows=1000, flush_quiet_seconds=2.0)
    try:
        await store.create_collection(small)
        await store.create_collection(bulk)
        await store.upsert(small.name, writes[:50], now=1)
        for start in range(0, len(writes), 200):  # a bulk ingest: many requests, one flush at the end
            await store.upsert(bulk.name, writes[start : start + 200], now=1)
        await store.flushes.settled()
        assert segment_states(milvus_name(bulk.name)) == ["Flushed"]
        assert "Flushed" not in segment_states(milvus_name(small.name))  # 50 rows: left growing
        deadline = time.monotonic() + 60
        while (index := client.describe_index(milvus_name(bulk.name), "vector"))["indexed_rows"] < len(writes):
            assert time.monotonic() < deadline, f"{index} {segment_states(milvus_name(bulk.name))}"
            await asyncio.sleep(0.5)
        assert (index["total_rows"], index["state"]) == (len(writes), "Finished")
        assert [hit.id for hit in await store.search(bulk.name, writes[7].vector, 1, None, None)] == ["7"]
    finally:
        await store.aclose()
        client.close()
