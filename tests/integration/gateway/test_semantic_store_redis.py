"""The semantic index on both stores (in-process and a real Redis), then Redis sharing and failure handling.

The index uses the real SimHash matcher, so the scores below are those the gateway computes:
against QUESTION, PARAPHRASE scores 0.953, REWORDED 0.859 and OTHER_TOPIC 0.734.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import pytest

from gateway import metrics
from gateway.cache.chat import exact_key
from gateway.cache.semantic import (
    REDIS_PREFIX,
    MemorySemanticStore,
    RedisSemanticStore,
    SemanticEntry,
    SemanticIndex,
    SemanticStore,
    SimHashMatcher,
    encode_entry,
)
from gateway.cache.semantic.simhash import ngram_cosine, ngram_counts, normalised
from tests.helpers.redis_fixtures import RedisServer

pytestmark = pytest.mark.slow

StoreFactory = Callable[[], SemanticStore]

QUESTION = "How do I reset the password of my email account?"
PARAPHRASE = "How do I reset the password of my email account"
REWORDED = "How can I reset the password of my email account?"
OTHER_TOPIC = "How do I change the password of my bank account?"


def chat(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": "glm-5", "temperature": 0.0, "messages": [{"role": "user", "content": text}]} | fields


def errors(operation: str) -> float:
    return float(metrics.CACHE_ERRORS.labels(cache="chat_semantic", operation=operation)._value.get())


@pytest.fixture(params=["memory", "redis"])
def make_store(request: pytest.FixtureRequest) -> StoreFactory:
    if request.param == "memory":
        return MemorySemanticStore
    url: str = request.getfixturevalue("redis_url")
    return lambda: RedisSemanticStore(url, 0.25)


def new_index(make_store: StoreFactory, threshold: float = 0.8, **kw: Any) -> SemanticIndex:
    return SemanticIndex(make_store(), SimHashMatcher(), threshold, **kw)


async def test_hit_above_threshold_miss_below_and_in_other_contexts(make_store: StoreFactory) -> None:
    async with aclosing(new_index(make_store)) as index:
        await index.add(chat(QUESTION), exact_key(chat(QUESTION)))
        hit = await index.lookup(chat(PARAPHRASE, stream=True))
        assert hit is not None and hit.answer_key == exact_key(chat(QUESTION))
        grams = [ngram_counts(normalised(text), 3) for text in (QUESTION, PARAPHRASE)]
        assert hit.similarity == pytest.approx(ngram_cosine(*grams))
        assert await index.lookup(chat(OTHER_TOPIC)) is None
        assert await index.lookup(chat(PARAPHRASE, model="deepseek-v4-pro")) is None
        assert await index.lookup(chat(PARAPHRASE, temperature=0.7)) is None


async def test_best_match_is_chosen(make_store: StoreFactory) -> None:
    async with aclosing(new_index(make_store)) as index:
        for text in (REWORDED, QUESTION, OTHER_TOPIC):
            await index.add(chat(text), exact_key(chat(text)))
        hit = await index.lookup(chat(PARAPHRASE))
        assert hit is not None and hit.answer_key == exact_key(chat(QUESTION))


async def test_entries_are_bounded_and_added_once(make_store: StoreFactory) -> None:
    async with aclosing(new_index(make_store, max_entries_per_context=3)) as index:
        # No digits: a question's numbers are part of its context.
        texts = [f"question {word} about something else entirely" for word in ("one", "two", "three", "four", "five")]
        for text in [*texts, texts[-1], texts[-1]]:
            await index.add(chat(text), exact_key(chat(text)))
        entries = await index.store.entries(index.context(chat("any")))
        assert [e.answer_key for e in entries] == [exact_key(chat(t)) for t in reversed(texts[-3:])]


async def test_redis_list_layout_and_expiry(redis_server: RedisServer, redis_url: str) -> None:
    async with aclosing(new_index(lambda: RedisSemanticStore(redis_url, 0.25), ttl_seconds=120)) as index:
        await index.add(chat(QUESTION), exact_key(chat(QUESTION)))
        key = REDIS_PREFIX + index.context(chat(QUESTION))
    assert redis_server.command("TYPE", key) == b"+list"
    assert redis_server.command("LLEN", key) == b":1"
    assert 110 <= int(redis_server.command("TTL", key)[1:]) <= 120


async def test_entry_written_by_one_replica_is_found_by_another(redis_url: str) -> None:
    writer = SemanticIndex(RedisSemanticStore(redis_url, 0.25), SimHashMatcher(), 0.8)
    reader = SemanticIndex(RedisSemanticStore(redis_url, 0.25), SimHashMatcher(), 0.8)
    try:
        assert await reader.lookup(chat(PARAPHRASE)) is None
        await writer.add(chat(QUESTION), exact_key(chat(QUESTION)))
        started = time.monotonic()
        while (hit := await reader.lookup(chat(PARAPHRASE))) is None and time.monotonic() - started < 1.0:
            await asyncio.sleep(0.01)
        assert hit is not None and hit.answer_key == exact_key(chat(QUESTION))
        waited = time.monotonic() - started
    finally:
        await writer.aclose()
        await reader.aclose()
    assert waited < 1.0


async def test_malformed_redis_entry_is_skipped(redis_url: str) -> None:
    store = RedisSemanticStore(redis_url, 0.25)
    try:
        good = SemanticEntry(b"12345678", "chat:v1:good")
        await store.add("ctx", good, max_entries=10, ttl_seconds=60)
        await store._client.lpush(REDIS_PREFIX + "ctx", b"\x05", encode_entry(good)[:6])
        assert await store.entries("ctx") == [good]
    finally:
        await store.aclose()


async def test_redis_stopped_lookup_and_add_return_quietly_and_count(redis_server: RedisServer, redis_url: str) -> None:
    index = SemanticIndex(RedisSemanticStore(redis_url, 0.25, backoff_seconds=1.0), SimHashMatcher(), 0.8)
    try:
        await index.add(chat(QUESTION), exact_key(chat(QUESTION)))
        redis_server.stop()
        get_errors, set_errors = errors("get"), errors("set")
        assert await index.lookup(chat(PARAPHRASE)) is None
        await index.add(chat(REWORDED), exact_key(chat(REWORDED)))
        assert (errors("get") - get_errors, errors("set") - set_errors) == (1, 1)

        started = time.perf_counter()
        assert await index.lookup(chat(PARAPHRASE)) is None  # backing off: no network
        assert time.perf_counter() - started < 0.05

        redis_server.start()
        await asyncio.sleep(1.1)  # past the back-off (1 s), a timer of the store's: its next call probes Redis
        await index.add(chat(QUESTION), exact_key(chat(QUESTION)))
        hit = await index.lookup(chat(PARAPHRASE))
        assert hit is not None and hit.answer_key == exact_key(chat(QUESTION))
    finally:
        await index.aclose()
