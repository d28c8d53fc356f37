"""The matchers: embedding (unit float32 vectors, dot product) and SimHash (8 bytes, short texts left out)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import pytest

from gateway.cache.semantic.matchers import EmbeddingMatcher, SimHashMatcher
from gateway.cache.semantic.simhash import simhash64
from tests.helpers.semantic import similar

T = TypeVar("T")


def run(awaitable: Awaitable[T]) -> T:
    async def main() -> T:
        return await awaitable

    return asyncio.run(main())


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


def test_simhash_leaves_texts_of_a_few_ngrams_unmatched() -> None:
    matcher = SimHashMatcher()
    short = [f"q{i}" for i in range(300)]
    fingerprints = asyncio.run(matcher.fingerprints(short))
    # the reason: different short texts look alike (these two score above the 0.88 default)
    assert matcher.similarity(fingerprints[171], fingerprints[172]) >= 0.88
    assert not any(matcher.comparable(text) for text in short)
    assert matcher.comparable("How do I reset my password?")
    assert matcher.comparable("我怎么才能重置我的密码呢")  # 12 characters, 10 distinct 3-grams
