"""The semantic cache's pieces: SimHash, the context key, the matchers and the index on the in-memory store."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import pytest

from gateway import metrics
from gateway.cache.base import CacheStoreError
from gateway.cache.chat import exact_key
from gateway.cache.semantic import (
    EmbeddingMatcher,
    MemorySemanticStore,
    SemanticEntry,
    SemanticHit,
    SemanticIndex,
    SimHashMatcher,
    decode_entry,
    encode_entry,
    query_negated,
    query_numbers,
    semantic_context_key,
    semantic_query,
    simhash64,
    simhash_similarity,
)

T = TypeVar("T")


def run(awaitable: Awaitable[T]) -> T:
    async def main() -> T:
        return await awaitable

    return asyncio.run(main())


def chat(text: str, **fields: Any) -> dict[str, Any]:
    earlier = fields.pop("earlier", [])
    body = {"model": "hunyuan-lite", "temperature": 0.2, "messages": [*earlier, {"role": "user", "content": text}]}
    return body | fields


def similar(a: str, b: str) -> float:
    return simhash_similarity(simhash64(a), simhash64(b))


# --- SimHash ------------------------------------------------------------------------------------


def test_simhash_is_stable_and_identical_texts_score_one() -> None:
    text = "How do I reset my password?"
    assert simhash64(text) == simhash64(text)
    assert 0 <= simhash64(text) < 1 << 64
    assert similar(text, text) == 1.0


def test_simhash_ignores_case_and_whitespace() -> None:
    assert similar("How do I  reset\nmy password?", "how do i reset my PASSWORD?") == 1.0


def test_simhash_small_edits_stay_close_and_unrelated_texts_far() -> None:
    base = "How do I reset the password of my email account?"
    assert similar(base, "How can I reset the password of my email account?") >= 0.8
    assert similar(base, "The weather in Paris is sunny with a light breeze today.") <= 0.7


def test_simhash_works_on_chinese_without_spaces() -> None:
    base = "请问如何重置我的电子邮箱账户的登录密码，我忘记了原来的密码"
    assert similar(base, "请问如何重置我的电子邮箱帐户的登录密码，我忘记了原来的密码") >= 0.8
    assert similar(base, "今天北京的天气怎么样，会下雨吗，需要带伞吗") <= 0.7


def test_simhash_of_short_and_empty_texts() -> None:
    assert simhash64("") == simhash64("   ") == 0
    assert simhash64("ab") != 0  # shorter than n: the whole text is one gram
    with pytest.raises(ValueError, match="n-gram size"):
        simhash64("text", n=0)


def test_simhash_similarity_counts_equal_bits() -> None:
    assert simhash_similarity(0, 0) == 1.0
    assert simhash_similarity(0, (1 << 64) - 1) == 0.0
    assert simhash_similarity(0b1011, 0b0001) == 1 - 2 / 64


# --- what is compared ---------------------------------------------------------------------------


def test_context_key_is_equal_for_paraphrased_last_turns() -> None:
    assert semantic_context_key(chat("How do I reset my password?")) == semantic_context_key(
        chat("What is the way to reset my password?")
    )


def test_context_key_ignores_delivery_fields() -> None:
    plain = chat("hi")
    delivered = chat("hello", stream=True, stream_options={"include_usage": True}, user="u-1")
    assert semantic_context_key(plain) == semantic_context_key(delivered)


@pytest.mark.parametrize(
    "other",
    [
        chat("hi", model="hunyuan-pro"),
        chat("hi", temperature=0.9),
        chat("hi", top_p=0.5),
        chat("hi", earlier=[{"role": "system", "content": "Answer in French."}]),
        chat("hi", earlier=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]),
        chat("hi") | {"messages": [{"role": "user", "content": "hi", "name": "bob"}]},
    ],
)
def test_context_key_differs_for_model_sampling_and_earlier_turns(other: dict[str, Any]) -> None:
    assert semantic_context_key(chat("hi")) != semantic_context_key(other)


def test_context_key_needs_all_earlier_turns_identical() -> None:
    first = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    changed = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "B"}]
    assert semantic_context_key(chat("q", earlier=first)) == semantic_context_key(chat("Q?", earlier=first))
    assert semantic_context_key(chat("q", earlier=first)) != semantic_context_key(chat("q", earlier=changed))


def test_questions_with_other_numbers_never_share_a_context() -> None:
    """Near-identical texts (SimHash 0.95 here), different questions: no answer may serve the other."""
    asked = chat("What is 12345 * 6789? Show the steps.")
    assert semantic_context_key(asked) != semantic_context_key(chat("What is 12345 * 6788? Show the steps."))
    assert semantic_context_key(asked) != semantic_context_key(chat("What is 6789 * 12345? Show the steps."))
    assert semantic_context_key(asked) == semantic_context_key(chat("Compute 12,345 * 6789, showing the steps."))
    assert query_numbers("Between 1,500 and 2.5, or 3") == ["1500", "2.5", "3"]
    assert query_numbers("the sum of 1,2 and 3,5; 12 and 3,456,789") == ["1,2", "3,5", "12", "3456789"]


@pytest.mark.parametrize(
    ("plain", "negated"),
    [
        ("How do I enable two-factor login?", "How do I not enable two-factor login?"),
        ("Why can I log in from my phone?", "Why can't I log in from my phone?"),
        ("为什么能登录", "为什么不能登录"),
        ("我有账号怎么办", "我没有账号怎么办"),
    ],
)
def test_negated_and_plain_questions_never_share_a_context(plain: str, negated: str) -> None:
    assert semantic_context_key(chat(plain)) != semantic_context_key(chat(negated))


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("How do I not enable two-factor login?", "How do I never enable two-factor login?"),
        ("Why can't I log in?", "Why am I never able to log in?"),
        ("How do I log in without a phone?", "How do I log in when I have no phone?"),
        ("Why can’t I log in?", "why cant i log in"),
        ("为什么不能登录", "为什么无法登录"),
        ("为什么没法登录", "为什么登录不了"),
        ("我必须去，要带什么", "我不得不去，要带什么"),  # a double negation is plain
        ("A和B有什么区别？", "A和B有什么不同？"),  # 不同 does not negate
    ],
)
def test_different_negations_of_a_question_share_a_context(first: str, second: str) -> None:
    assert semantic_context_key(chat(first)) == semantic_context_key(chat(second))


@pytest.mark.parametrize(
    "text",
    [
        "I don't want to not go: what do I pack?",  # two negations
        "我不得不去，要带什么",  # 不得不: must
        "Not only the app but the website: how do I log in?",
        "No matter what, how do I log in? See No. 2",
        "是不是要登录？能不能登录？有没有人知道？",  # A-not-A: yes-or-no questions
        "瑞士军刀能带上火车不？",  # clause-final 不: a question particle
        "这部电影非常不错，不同版本有什么区别，别人怎么说",  # 非常, 不错, 不同, 区别, 别人
        "无线网络无论如何都连得上吗",  # 无线, 无论
    ],
)
def test_double_negations_and_words_that_do_not_negate_keep_polarity(text: str) -> None:
    assert not query_negated(text)


def test_neither_nor_is_one_negation() -> None:
    assert query_negated("Why can neither the app nor the website log me in?")


def test_plain_questions_keep_the_context_key_of_before_polarity() -> None:
    body = chat("How do I reset my password?")
    canonical = {"messages": [{"role": "user"}], "model": "hunyuan-lite", "query_numbers": [], "temperature": 0.2}
    text = json.dumps(canonical, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    assert semantic_context_key(body) == hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_semantic_query_is_the_last_user_text() -> None:
    assert semantic_query(chat("What is 2+2?", earlier=[{"role": "system", "content": "s"}])) == "What is 2+2?"


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m"},
        {"model": "m", "messages": []},
        {"model": "m", "messages": "hi"},
        {"model": "m", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        {"model": "m", "messages": [{"role": "system", "content": "s"}]},
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}]},
        {"model": "m", "messages": [{"role": "user", "content": None}]},
        {"model": "m", "messages": ["not a message"]},
    ],
)
def test_semantic_query_none_when_not_cacheable(body: dict[str, Any]) -> None:
    assert semantic_query(body) is None


# --- matchers and entries -----------------------------------------------------------------------


class FixedEmbedder:
    def __init__(self, vectors: dict[str, list[float]]) -> None:
        self.vectors = vectors

    async def embed_texts(self, texts: list[str]) -> npt.NDArray[np.float32]:
        return np.array([self.vectors[t] for t in texts], dtype=np.float32)


def test_embedding_matcher_fingerprints_are_unit_float32_and_similarity_is_the_dot_product() -> None:
    matcher = EmbeddingMatcher(FixedEmbedder({"a": [3.0, 4.0], "b": [1.0, 0.0]}))
    a, b = run(matcher.fingerprints(["a", "b"]))
    assert np.frombuffer(a, dtype="<f4").tolist() == pytest.approx([0.6, 0.8])
    assert len(a) == 8
    assert matcher.similarity(a, b) == pytest.approx(0.6)
    assert matcher.similarity(a, a) == pytest.approx(1.0)
    assert matcher.similarity(a, b"\x00" * 12) == 0.0  # another model's dimension is never a match


def test_simhash_matcher_fingerprints_are_eight_bytes() -> None:
    matcher = SimHashMatcher()
    a, b = run(matcher.fingerprints(["reset my password", "reset my password!"]))
    assert len(a) == len(b) == 8
    assert int.from_bytes(a, "little") == simhash64("reset my password")
    assert matcher.similarity(a, a) == 1.0
    assert matcher.similarity(a, b) == similar("reset my password", "reset my password!")


def test_entry_framing_round_trips_and_rejects_truncated_entries() -> None:
    entry = SemanticEntry(b"\x00\x01\xff" * 5, "chat:v1:abc")
    assert decode_entry(encode_entry(entry)) == entry
    with pytest.raises(ValueError):
        decode_entry(encode_entry(entry)[:10])
    with pytest.raises(ValueError):
        decode_entry(b"\x01")


# --- the index ----------------------------------------------------------------------------------


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


def with_index(scenario: Callable[[SemanticIndex], Awaitable[T]], threshold: float = 0.9, **options: Any) -> T:
    async def main() -> T:
        index = SemanticIndex(MemorySemanticStore(), ScoreMatcher(), threshold, **options)
        try:
            return await scenario(index)
        finally:
            await index.aclose()

    return asyncio.run(main())


async def remember(index: SemanticIndex, *texts: str, **fields: Any) -> None:
    for text in texts:
        await index.add(chat(text, **fields), exact_key(chat(text, **fields)))


def errors(operation: str) -> float:
    return float(metrics.CACHE_ERRORS.labels(cache="chat_semantic", operation=operation)._value.get())


def test_hit_at_or_above_threshold_returns_the_earlier_exact_key() -> None:
    async def scenario(index: SemanticIndex) -> list[SemanticHit | None]:
        await remember(index, q("pw", 0.50))
        return [await index.lookup(chat(q("pw", 0.55))), await index.lookup(chat(q("pw", 0.60)))]

    near, edge = with_index(scenario)
    assert near is not None and near.answer_key == exact_key(chat(q("pw", 0.50)))
    assert near.similarity == pytest.approx(0.95)
    assert edge is not None and edge.answer_key == exact_key(chat(q("pw", 0.50)))


def test_miss_below_threshold_other_topic_or_other_context() -> None:
    async def scenario(index: SemanticIndex) -> list[SemanticHit | None]:
        await remember(index, q("pw", 0.50))
        return [
            await index.lookup(chat(q("pw", 0.65))),
            await index.lookup(chat(q("weather", 0.50))),
            await index.lookup(chat(q("pw", 0.50), model="hunyuan-pro")),
            await index.lookup(chat(q("pw", 0.50), temperature=1.0)),
            await index.lookup(chat(q("pw", 0.50), earlier=[{"role": "system", "content": "s"}])),
            await index.lookup(
                {"model": "hunyuan-lite", "messages": [{"role": "assistant", "content": q("pw", 0.50)}]}
            ),
        ]

    assert with_index(scenario) == [None] * 6


def test_best_match_is_chosen() -> None:
    async def scenario(index: SemanticIndex) -> SemanticHit | None:
        await remember(index, q("pw", 0.40), q("pw", 0.52), q("pw", 0.45), q("pw", 0.60))
        return await index.lookup(chat(q("pw", 0.53)))

    hit = with_index(scenario, threshold=0.8)
    assert hit is not None and hit.answer_key == exact_key(chat(q("pw", 0.52)))
    assert hit.similarity == pytest.approx(0.99)


def test_entries_per_context_are_bounded_newest_kept() -> None:
    async def scenario(index: SemanticIndex) -> tuple[list[SemanticEntry], SemanticHit | None]:
        await remember(index, q("pw", 0.10), q("pw", 0.20), q("pw", 0.30), q("pw", 0.40))
        entries = await index.store.entries(index.context(chat(q("pw", 0))))
        return entries, await index.lookup(chat(q("pw", 0.10)))

    entries, oldest = with_index(scenario, threshold=0.95, max_entries_per_context=3)
    assert [e.answer_key for e in entries] == [exact_key(chat(q("pw", i / 10))) for i in (4, 3, 2)]
    assert oldest is None


def test_identical_query_is_added_once_per_context() -> None:
    async def scenario(index: SemanticIndex) -> tuple[int, int]:
        await remember(index, q("pw", 0.50), q("pw", 0.50), q("pw", 0.50))
        await remember(index, q("pw", 0.50), model="hunyuan-pro")
        one = len(await index.store.entries(index.context(chat(q("pw", 0.50)))))
        other = len(await index.store.entries(index.context(chat(q("pw", 0.50), model="hunyuan-pro"))))
        return one, other

    assert with_index(scenario) == (1, 1)


def test_lookup_fingerprint_is_reused_by_the_add_after_a_miss() -> None:
    matcher = ScoreMatcher()

    async def main() -> None:
        index = SemanticIndex(MemorySemanticStore(), matcher, 0.9)
        assert await index.lookup(chat(q("pw", 0.50))) is None  # an empty context: nothing to compare, no embedding
        assert matcher.calls == 0
        await remember(index, q("pw", 0.10))
        assert await index.lookup(chat(q("pw", 0.50))) is None
        await index.add(chat(q("pw", 0.50)), exact_key(chat(q("pw", 0.50))))
        await index.aclose()

    asyncio.run(main())
    assert matcher.calls == 2


def test_uncacheable_bodies_are_neither_added_nor_looked_up() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": q("pw", 0.5)}]}]}

    async def scenario(index: SemanticIndex) -> SemanticHit | None:
        await index.add(body, "chat:v1:x")
        return await index.lookup(body)

    assert with_index(scenario) is None


class FailingStore(MemorySemanticStore):
    async def entries(self, context: str) -> list[SemanticEntry]:
        raise CacheStoreError("redis lrange failed: ConnectionError")


class FailingMatcher(ScoreMatcher):
    async def fingerprints(self, texts: list[str]) -> list[bytes]:
        raise RuntimeError("triton unavailable")


def test_store_failure_is_counted_and_served_as_a_miss() -> None:
    before = errors("get"), errors("set")

    async def main() -> SemanticHit | None:
        index = SemanticIndex(FailingStore(), ScoreMatcher(), 0.9)
        await index.add(chat(q("pw", 0.5)), "chat:v1:x")
        return await index.lookup(chat(q("pw", 0.5)))

    assert asyncio.run(main()) is None
    assert (errors("get"), errors("set")) == (before[0] + 1, before[1] + 1)


def test_matcher_failure_is_counted_and_served_as_a_miss() -> None:
    before = errors("fingerprint")

    async def main() -> SemanticHit | None:
        index = SemanticIndex(MemorySemanticStore(), FailingMatcher(), 0.9)
        await index.store.add(
            index.context(chat("x")), SemanticEntry(q("pw", 0.5).encode(), "k"), max_entries=5, ttl_seconds=60
        )
        await index.add(chat(q("pw", 0.6)), "chat:v1:x")
        return await index.lookup(chat(q("pw", 0.5)))

    assert asyncio.run(main()) is None
    assert errors("fingerprint") == before + 2


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_memory_store_expires_contexts_and_bounds_their_number() -> None:
    clock = ManualClock()
    store = MemorySemanticStore(max_contexts=2, clock=clock)
    entry = SemanticEntry(b"f", "k")

    async def main() -> list[list[SemanticEntry]]:
        for context in ("a", "b", "c"):
            await store.add(context, entry, max_entries=5, ttl_seconds=10)
        found = [await store.entries(c) for c in ("a", "b", "c")]
        clock.now += 10
        return [*found, await store.entries("c")]

    assert asyncio.run(main()) == [[], [entry], [entry], []]


@pytest.mark.parametrize(
    ("threshold", "options"),
    [(1.5, {}), (0.9, {"max_entries_per_context": 0}), (0.9, {"ttl_seconds": 0})],
)
def test_index_rejects_bad_options(threshold: float, options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        SemanticIndex(MemorySemanticStore(), ScoreMatcher(), threshold, **options)


def test_simhash_leaves_texts_of_a_few_ngrams_unmatched() -> None:
    matcher = SimHashMatcher()
    short = [f"q{i}" for i in range(300)]
    fingerprints = asyncio.run(matcher.fingerprints(short))
    # the reason: different short texts look alike (these two score above the 0.88 default)
    assert matcher.similarity(fingerprints[171], fingerprints[172]) >= 0.88
    assert not any(matcher.comparable(text) for text in short)
    assert matcher.comparable("How do I reset my password?")
    assert matcher.comparable("我怎么才能重置我的密码呢")  # 12 characters, 10 distinct 3-grams
