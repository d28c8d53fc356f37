"""The matchers: embedding (unit float32 vectors, dot product) and n-gram cosine pruned by SimHash (short and long
texts left out)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import numpy.typing as npt
import pytest

from gateway.cache.semantic.matchers import EmbeddingMatcher, SimHashMatcher
from gateway.cache.semantic.simhash import simhash64
from tests.helpers.semantic import similar


class FixedEmbedder:
    def __init__(self, vectors: dict[str, list[float]]) -> None:
        self.vectors = vectors

    async def embed_texts(self, texts: list[str]) -> npt.NDArray[np.float32]:
        return np.array([self.vectors[t] for t in texts], dtype=np.float32)


async def test_embedding_matcher_fingerprints_are_unit_float32_and_similarity_is_the_dot_product() -> None:
    matcher = EmbeddingMatcher(FixedEmbedder({"a": [3.0, 4.0], "b": [1.0, 0.0]}))
    a, b = await matcher.fingerprints(["a", "b"])
    assert np.frombuffer(a, dtype="<f4").tolist() == pytest.approx([0.6, 0.8])
    assert len(a) == 8
    assert matcher.similarity(a, b) == pytest.approx(0.6)
    assert matcher.similarity(a, a) == pytest.approx(1.0)
    assert matcher.similarity(a, b"\x00" * 12) == 0.0  # another model's dimension is never a match


async def test_simhash_matcher_fingerprints_are_the_simhash_and_the_text_and_score_the_ngram_cosine() -> None:
    matcher = SimHashMatcher()
    a, b = await matcher.fingerprints(["Reset my  password", "reset my password!"])
    assert int.from_bytes(a[:8], "little") == simhash64("reset my password") and a[8:] == b"reset my password"
    assert matcher.similarity(a, a) == 1.0
    assert matcher.similarity(a, b) == pytest.approx(cosine("reset my password", "reset my password!"))
    assert matcher.similarity(a, a[:8]) == 0.0  # a fingerprint without its text (an older format) never matches


async def test_simhash_matcher_does_not_take_a_question_about_another_subject_for_a_paraphrase() -> None:
    """Found by the soak: two questions that share their frame and differ in subject and verb have 64-bit SimHashes
    within a few bits of each other (an estimate of 0.88 or more); their n-gram cosine is far below any threshold."""
    asked = "what is the reason a stream is retried on a region failover?"
    cached = "what is the reason a collection is limited by a region failover?"
    assert similar(asked, cached) >= 0.88
    matcher = SimHashMatcher()
    a, b = await matcher.fingerprints([asked, cached])
    assert matcher.similarity(a, b) == pytest.approx(cosine(asked, cached))
    assert matcher.similarity(a, b) < 0.8
    paraphrase = (await matcher.fingerprints(["so what is the reason a stream is retried on a region failover?"]))[0]
    assert matcher.similarity(a, paraphrase) >= 0.9


async def test_simhash_matcher_scores_far_pairs_by_their_estimate() -> None:
    matcher = SimHashMatcher()
    a, b = await matcher.fingerprints(["how do I rotate an API key?", "the weather in Lisbon is mild in winter"])
    assert matcher.similarity(a, b) == similar("how do I rotate an API key?", "the weather in Lisbon is mild in winter")
    assert matcher.similarity(a, b) < SimHashMatcher.PRUNE_BELOW


def test_simhash_leaves_texts_of_a_few_ngrams_and_long_texts_unmatched() -> None:
    matcher = SimHashMatcher()
    short = [f"q{i}" for i in range(300)]
    # the reason: different short texts look alike, to the SimHash (0.88 or more) and in n-grams
    assert similar(short[171], short[172]) >= 0.88
    assert not any(matcher.comparable(text) for text in short)
    assert matcher.comparable("How do I reset my password?")
    assert matcher.comparable("我怎么才能重置我的密码呢")  # 12 characters, 10 distinct 3-grams
    assert not matcher.comparable("why " * (SimHashMatcher.MAX_TEXT_BYTES // 4 + 1))  # its text rides in every entry


def cosine(a: str, b: str) -> float:
    """The cosine of the two texts' character 3-gram counts, written out here."""
    grams = [Counter(t[i : i + 3] for i in range(len(t) - 2)) for t in (" ".join(a.lower().split()), b)]
    dot = sum(count * grams[1][gram] for gram, count in grams[0].items())
    return dot / math.sqrt(sum(c * c for c in grams[0].values()) * sum(c * c for c in grams[1].values()))
