"""One suite for both cache stores (in-process memory and a real Redis), then Redis failure handling.

Every test runs in its own event loop (anyio's pytest plugin) and closes its store,
so no client socket outlives a test.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import aclosing, closing

import numpy as np
import pytest

from gateway import metrics
from gateway.cache.base import ByteStore, CacheStoreError
from gateway.cache.embeddings import CachedEmbedding, EmbeddingCache, embedding_key
from gateway.cache.memory import MemoryStore
from gateway.cache.redis_store import RedisStore
from gateway.cache.stores import build_store
from gateway.redis_client import RedisConnection
from gateway.settings import CacheSettings
from localtriton.ports import free_port
from tests.helpers.redis_fixtures import RedisServer

pytestmark = pytest.mark.slow

StoreFactory = Callable[[], ByteStore]

MODEL = "BAAI/bge-large-zh-v1.5"
REVISION = "r1"
CACHE = "test-embedding"


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
def make_store(request: pytest.FixtureRequest) -> StoreFactory:
    if request.param == "memory":
        return lambda: MemoryStore(1 << 20)
    url: str = request.getfixturevalue("redis_url")
    return lambda: RedisStore(url)


def vector_entry(seed: int, dimension: int = 32) -> CachedEmbedding:
    vector = np.random.default_rng(seed).standard_normal(dimension).astype(np.float32)
    return CachedEmbedding(vector=vector, token_count=seed + 3, truncated=seed % 2 == 1)


def lookups(result: str) -> float:
    return float(metrics.CACHE_LOOKUPS.labels(cache=CACHE, result=result)._value.get())


def errors(operation: str) -> float:
    return float(metrics.CACHE_ERRORS.labels(cache=CACHE, operation=operation)._value.get())


def same(a: CachedEmbedding | None, b: CachedEmbedding) -> bool:
    return (
        a is not None
        and a.vector.tobytes() == b.vector.tobytes()
        and (a.token_count, a.truncated) == (b.token_count, b.truncated)
    )


# Both stores


async def test_round_trip_missing_keys_and_order(make_store: StoreFactory) -> None:
    async with aclosing(make_store()) as store:
        await store.set_many({"a": b"1", "b": b"\x00\xff\r\n", "empty": b""})
        assert await store.get_many(["b", "missing", "a", "empty", "b"]) == [
            b"\x00\xff\r\n",
            None,
            b"1",
            b"",
            b"\x00\xff\r\n",
        ]
        assert await store.get_many([]) == []
        await store.set_many({})
        assert await store.ping() is True


async def test_many_items_in_one_call(make_store: StoreFactory) -> None:
    items = {f"key-{i}": i.to_bytes(4, "little") * 256 for i in range(500)}

    async with aclosing(make_store()) as store:
        await store.set_many(items, ttl_seconds=60)
        keys = list(reversed(items))
        assert await store.get_many(keys) == [items[key] for key in keys]


async def test_ttl_expiry(make_store: StoreFactory) -> None:
    async with aclosing(make_store()) as store:
        await store.set_many({"short": b"1"}, ttl_seconds=1)
        await store.set_many({"kept": b"2"})
        assert await store.get_many(["short", "kept"]) == [b"1", b"2"]
        await asyncio.sleep(1.2)
        assert await store.get_many(["short", "kept"]) == [None, b"2"]


async def test_embedding_cache_counts_hits_and_misses(make_store: StoreFactory) -> None:
    texts = ["hello", "你好", "world"]
    entries = [vector_entry(seed) for seed in range(3)]

    async with aclosing(make_store()) as store:
        cache = EmbeddingCache(store, ttl_seconds=60, name=CACHE)
        hits, misses = lookups("hit"), lookups("miss")
        assert await cache.get_many(MODEL, REVISION, texts) == [None, None, None]
        assert (lookups("hit") - hits, lookups("miss") - misses) == (0, 3)

        await cache.put_many(MODEL, REVISION, texts[:2], entries[:2])
        found = await cache.get_many(MODEL, REVISION, ["你好", "world", "hello", "你好"])
        assert same(found[0], entries[1]) and found[1] is None
        assert same(found[2], entries[0]) and same(found[3], entries[1])
        assert (lookups("hit") - hits, lookups("miss") - misses) == (3, 4)
        assert await cache.get_many(MODEL, REVISION, []) == []
        assert await cache.ping() is True


async def test_changed_revision_or_model_misses(make_store: StoreFactory) -> None:
    async with aclosing(make_store()) as store:
        cache = EmbeddingCache(store, ttl_seconds=None, name=CACHE)
        await cache.put_many(MODEL, REVISION, ["text"], [vector_entry(1)])
        assert await cache.get_many(MODEL, "r2", ["text"]) == [None]
        assert await cache.get_many("other-model", REVISION, ["text"]) == [None]
        assert same((await cache.get_many(MODEL, REVISION, ["text"]))[0], vector_entry(1))


async def test_malformed_value_is_a_miss_and_an_error(
    make_store: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.cache.embeddings"):
        async with aclosing(make_store()) as store:
            cache = EmbeddingCache(store, ttl_seconds=60, name=CACHE)
            await store.set_many({embedding_key(MODEL, REVISION, "bad"): b"not a vector"})
            misses, get_errors = lookups("miss"), errors("get")
            assert await cache.get_many(MODEL, REVISION, ["bad"]) == [None]
            assert (lookups("miss") - misses, errors("get") - get_errors) == (1, 1)
    assert "malformed cached value" in caplog.text


async def test_put_many_rejects_mismatched_lengths(make_store: StoreFactory) -> None:
    async with aclosing(make_store()) as store:
        cache = EmbeddingCache(store, ttl_seconds=60, name=CACHE)
        with pytest.raises(ValueError, match="2 texts but 1 entries"):
            await cache.put_many(MODEL, REVISION, ["a", "b"], [vector_entry(0)])


# Redis failures


async def test_redis_outage_degrades_to_misses_and_recovers(redis_server: RedisServer, redis_url: str) -> None:
    cache = EmbeddingCache(RedisStore(redis_url, backoff_seconds=1.0), ttl_seconds=60, name=CACHE)
    try:
        await cache.put_many(MODEL, REVISION, ["before"], [vector_entry(0)])
        assert same((await cache.get_many(MODEL, REVISION, ["before"]))[0], vector_entry(0))

        redis_server.stop()
        get_errors, set_errors = errors("get"), errors("set")
        assert await cache.get_many(MODEL, REVISION, ["before", "other"]) == [None, None]
        await cache.put_many(MODEL, REVISION, ["during"], [vector_entry(1)])
        assert await cache.ping() is False
        assert (errors("get") - get_errors, errors("set") - set_errors) == (1, 1)

        started = time.perf_counter()
        assert await cache.get_many(MODEL, REVISION, ["before"]) == [None]
        await cache.put_many(MODEL, REVISION, ["during"], [vector_entry(1)])
        assert time.perf_counter() - started < 0.05

        redis_server.start()
        await asyncio.sleep(1.1)  # past the back-off (1 s), a timer of the store's: its next call probes Redis
        await cache.put_many(MODEL, REVISION, ["after"], [vector_entry(2)])
        found = await cache.get_many(MODEL, REVISION, ["after", "before"])
        assert same(found[0], vector_entry(2))
        assert found[1] is None  # the restarted Redis keeps nothing (no persistence)
        assert await cache.ping() is True
    finally:
        await cache.aclose()


async def test_back_off_touches_no_network(redis_server: RedisServer, redis_url: str) -> None:
    """During the back-off calls fail even though Redis is back; once it is over, the call that finds it over is
    still skipped but starts a probe in the background, and after the probe calls reach Redis again."""
    clock = ManualClock()

    store = RedisStore(redis_url, backoff_seconds=1.0, clock=clock)
    try:
        redis_server.stop()
        with pytest.raises(CacheStoreError, match="redis get failed: ConnectionError"):
            await store.get_many(["k"])
        redis_server.start()
        clock.now += 0.9
        with pytest.raises(CacheStoreError, match=r"redis set skipped: backing off after a failure, 0.10 s left"):
            await store.set_many({"k": b"v"})
        clock.now += 0.1
        with pytest.raises(CacheStoreError, match="redis set skipped"):
            await store.set_many({"k": b"v"})  # never waits on a Redis that may still hang
        deadline = time.monotonic() + 5
        while not await store.ping():  # until the background probe's PING has answered
            assert time.monotonic() < deadline, "the probe did not close the circuit"
            await asyncio.sleep(0.01)
        await store.set_many({"k": b"v"})
        assert await store.get_many(["k"]) == [b"v"]
    finally:
        await store.aclose()


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts connections and never answers: a hung Redis."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield int(listener.getsockname()[1])


async def test_hung_redis_costs_one_timeout_not_retries(silent_server: int) -> None:
    store = RedisStore(f"redis://127.0.0.1:{silent_server}/0", timeout_seconds=0.1)
    try:
        started = time.perf_counter()
        with pytest.raises(CacheStoreError, match="redis get failed: TimeoutError"):
            await store.get_many(["k"])
        elapsed = time.perf_counter() - started
    finally:
        await store.aclose()
    assert elapsed < 0.5


async def test_password_never_appears_in_errors_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    url = f"redis://user:hunter2-secret@127.0.0.1:{free_port()}/0"  # nothing listens there

    with caplog.at_level(logging.DEBUG):
        store = RedisStore(url, backoff_seconds=0.001)
        cache = EmbeddingCache(store, ttl_seconds=60, name=CACHE)
        try:
            with pytest.raises(CacheStoreError) as raised:
                await store.get_many(["k"])
            assert "hunter2" not in str(raised.value) and "hunter2" not in repr(store)
            await asyncio.sleep(0.01)  # past the back-off: the cache's call probes Redis again
            assert await cache.get_many(MODEL, REVISION, ["k"]) == [None]
        finally:
            await cache.aclose()
    assert "serving without the cache" in caplog.text
    assert "hunter2" not in caplog.text


def test_malformed_url_is_not_echoed() -> None:
    with pytest.raises(ValueError, match="REDIS_URL is malformed") as raised:
        RedisStore("redis://user:hunter2@host:63x79/0")
    assert "hunter2" not in str(raised.value) and raised.value.__cause__ is None


# Store selection


async def test_build_store_uses_the_shared_redis_connection(redis_url: str) -> None:
    redis = RedisConnection(redis_url)
    store = build_store(redis, memory_mb=CacheSettings().embedding_cache_mb)
    assert isinstance(store, RedisStore)

    try:
        await store.set_many({"k": b"v"})
        assert await store.get_many(["k"]) == [b"v"]
    finally:
        await store.aclose()
        assert await redis.call(redis.client.ping)  # the store's close leaves the shared client open
        await redis.aclose()


def test_build_store_falls_back_to_bounded_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBEDDING_CACHE_MB", "1.5")
    store = build_store(None, memory_mb=CacheSettings().embedding_cache_mb)
    assert isinstance(store, MemoryStore)
    assert store.max_bytes == 1572864
    monkeypatch.setenv("EMBEDDING_CACHE_MB", "0")
    disabled = build_store(None, memory_mb=CacheSettings().embedding_cache_mb)
    assert isinstance(disabled, MemoryStore) and disabled.max_bytes == 0
