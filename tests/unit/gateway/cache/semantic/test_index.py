"""The semantic index on the in-memory store: threshold, best match, bounds, reuse of fingerprints, failures."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from gateway import metrics
from gateway.cache.base import CacheStoreError
from gateway.cache.chat import exact_key
from gateway.cache.semantic.index import SemanticIndex
from gateway.cache.semantic.stores import MemorySemanticStore, SemanticEntry
from tests.helpers.semantic import chat


def q(topic: str, score: float) -> str:
    """A `ScoreMatcher` text: the score as a count of marks, since numbers in a query split its context."""
    return f"{topic}:" + "#" * round(score * 100)


class ScoreMatcher:
    """Deterministic: a text is `q(topic, score)`; texts of one topic score 1 - |difference|, other topics 0."""

    name = "score"

    def __init__(self) -> None:
        self.calls = 0

    async def fingerprints(self, texts: list[str]) -> list[bytes]:
        self.calls += 1
        return [text.encode() for text in texts]

    def similarity(self, a: bytes, b: bytes) -> float:
        (topic_a, marks_a), (topic_b, marks_b) = (x.decode().split(":") for x in (a, b))
        return 1 - abs(len(marks_a) - len(marks_b)) / 100 if topic_a == topic_b else 0.0

    def comparable(self, text: str) -> bool:
        return True


@asynccontextmanager
async def opened_index(threshold: float = 0.9, **options: Any) -> AsyncIterator[SemanticIndex]:
    index = SemanticIndex(MemorySemanticStore(), ScoreMatcher(), threshold, **options)
    try:
        yield index
    finally:
        await index.aclose()


async def remember(index: SemanticIndex, *texts: str, **fields: Any) -> None:
    for text in texts:
        await index.add(chat(text, **fields), exact_key(chat(text, **fields)))


def errors(operation: str) -> float:
    return float(metrics.CACHE_ERRORS.labels(cache="chat_semantic", operation=operation)._value.get())


async def test_hit_at_or_above_threshold_returns_the_earlier_exact_key() -> None:
    async with opened_index() as index:
        await remember(index, q("pw", 0.50))
        near, edge = [await index.lookup(chat(q("pw", 0.55))), await index.lookup(chat(q("pw", 0.60)))]
    assert near is not None and near.answer_key == exact_key(chat(q("pw", 0.50)))
    assert near.similarity == pytest.approx(0.95)
    assert edge is not None and edge.answer_key == exact_key(chat(q("pw", 0.50)))


async def test_miss_below_threshold_other_topic_or_other_context() -> None:
    async with opened_index() as index:
        await remember(index, q("pw", 0.50))
        found = [
            await index.lookup(chat(q("pw", 0.65))),
            await index.lookup(chat(q("weather", 0.50))),
            await index.lookup(chat(q("pw", 0.50), model="deepseek-v4-pro")),
            await index.lookup(chat(q("pw", 0.50), temperature=1.0)),
            await index.lookup(chat(q("pw", 0.50), earlier=[{"role": "system", "content": "s"}])),
            await index.lookup({"model": "glm-5", "messages": [{"role": "assistant", "content": q("pw", 0.50)}]}),
        ]
    assert found == [None] * 6


async def test_best_match_is_chosen() -> None:
    async with opened_index(threshold=0.8) as index:
        await remember(index, q("pw", 0.40), q("pw", 0.52), q("pw", 0.45), q("pw", 0.60))
        hit = await index.lookup(chat(q("pw", 0.53)))
    assert hit is not None and hit.answer_key == exact_key(chat(q("pw", 0.52)))
    assert hit.similarity == pytest.approx(0.99)


async def test_entries_per_context_are_bounded_newest_kept() -> None:
    async with opened_index(threshold=0.95, max_entries_per_context=3) as index:
        await remember(index, q("pw", 0.10), q("pw", 0.20), q("pw", 0.30), q("pw", 0.40))
        entries = await index.store.entries(index.context(chat(q("pw", 0))))
        oldest = await index.lookup(chat(q("pw", 0.10)))
    assert [e.answer_key for e in entries] == [exact_key(chat(q("pw", i / 10))) for i in (4, 3, 2)]
    assert oldest is None


async def test_identical_query_is_added_once_per_context() -> None:
    async with opened_index() as index:
        await remember(index, q("pw", 0.50), q("pw", 0.50), q("pw", 0.50))
        await remember(index, q("pw", 0.50), model="deepseek-v4-pro")
        one = len(await index.store.entries(index.context(chat(q("pw", 0.50)))))
        other = len(await index.store.entries(index.context(chat(q("pw", 0.50), model="deepseek-v4-pro"))))
    assert (one, other) == (1, 1)


async def test_lookup_fingerprint_is_reused_by_the_add_after_a_miss() -> None:
    matcher = ScoreMatcher()

    index = SemanticIndex(MemorySemanticStore(), matcher, 0.9)
    assert await index.lookup(chat(q("pw", 0.50))) is None  # an empty context: nothing to compare, no embedding
    assert matcher.calls == 0
    await remember(index, q("pw", 0.10))
    assert await index.lookup(chat(q("pw", 0.50))) is None
    await index.add(chat(q("pw", 0.50)), exact_key(chat(q("pw", 0.50))))
    await index.aclose()
    assert matcher.calls == 2


async def test_uncacheable_bodies_are_neither_added_nor_looked_up() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": q("pw", 0.5)}]}]}
    async with opened_index() as index:
        await index.add(body, "chat:v1:x")
        found = await index.lookup(body)
    assert found is None


class FailingStore(MemorySemanticStore):
    async def entries(self, context: str) -> list[SemanticEntry]:
        raise CacheStoreError("redis lrange failed: ConnectionError")


class FailingMatcher(ScoreMatcher):
    async def fingerprints(self, texts: list[str]) -> list[bytes]:
        raise RuntimeError("triton unavailable")


async def test_store_failure_is_counted_and_served_as_a_miss() -> None:
    before = errors("get"), errors("set")

    index = SemanticIndex(FailingStore(), ScoreMatcher(), 0.9)
    await index.add(chat(q("pw", 0.5)), "chat:v1:x")
    assert await index.lookup(chat(q("pw", 0.5))) is None
    assert (errors("get"), errors("set")) == (before[0] + 1, before[1] + 1)


async def test_matcher_failure_is_counted_and_served_as_a_miss() -> None:
    before = errors("fingerprint")

    index = SemanticIndex(MemorySemanticStore(), FailingMatcher(), 0.9)
    await index.store.add(
        index.context(chat("x")), SemanticEntry(q("pw", 0.5).encode(), "k"), max_entries=5, ttl_seconds=60
    )
    await index.add(chat(q("pw", 0.6)), "chat:v1:x")
    assert await index.lookup(chat(q("pw", 0.5))) is None
    assert errors("fingerprint") == before + 2


@pytest.mark.parametrize(
    ("threshold", "options"),
    [(1.5, {}), (0.9, {"max_entries_per_context": 0}), (0.9, {"ttl_seconds": 0})],
)
def test_index_rejects_bad_options(threshold: float, options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        SemanticIndex(MemorySemanticStore(), ScoreMatcher(), threshold, **options)
