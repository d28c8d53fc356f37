"""How two questions are compared: a matcher turns texts into fingerprints and scores a pair of them.

`EmbeddingMatcher` scores the cosine of embedding vectors from a `TextEmbedder` it is
given at wiring (the gateway passes its embedding service); `SimHashMatcher` scores
the cosine of character n-gram counts, pruned by SimHashes, and needs no model.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Protocol

import numpy as np
import numpy.typing as npt

from gateway.cache.semantic.simhash import ngram_cosine, ngram_counts, normalised, simhash64, simhash_similarity


class TextEmbedder(Protocol):
    """Whatever turns texts into vectors; the semantic cache knows nothing else of the embedding model."""

    async def embed_texts(self, texts: list[str]) -> npt.NDArray[np.float32]:
        """Unit vectors, float32 [len(texts), dimension]."""
        ...


class Matcher(Protocol):
    name: str  # part of the store context: fingerprints of different matchers are never compared

    async def fingerprints(self, texts: list[str]) -> list[bytes]: ...

    def similarity(self, a: bytes, b: bytes) -> float: ...

    def comparable(self, text: str) -> bool:
        """Whether `text` carries enough to be matched at all; others are neither looked up nor indexed."""
        ...


class EmbeddingMatcher:
    """Cosine similarity of the embedding model's vectors; a fingerprint is the float32 little-endian unit vector.

    Name it after the model (e.g. "embedding:<model>@<revision>") so that changing
    the model starts a new index instead of comparing vectors of different spaces.
    """

    def __init__(self, embedder: TextEmbedder, name: str = "embedding") -> None:
        self._embedder = embedder
        self.name = name

    async def fingerprints(self, texts: list[str]) -> list[bytes]:
        vectors = np.asarray(await self._embedder.embed_texts(texts), dtype="<f4")
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.where(norms > 0, norms, 1.0).astype("<f4")  # already unit: guards a foreign embedder
        return [row.tobytes() for row in vectors]

    def similarity(self, a: bytes, b: bytes) -> float:
        if len(a) != len(b) or len(a) % 4:
            return 0.0
        return float(np.dot(np.frombuffer(a, dtype="<f4"), np.frombuffer(b, dtype="<f4")))

    def comparable(self, text: str) -> bool:
        return bool(text.strip())


class SimHashMatcher:
    """Cosine of two texts' character n-gram counts, found through 64-bit SimHashes; needs no model.

    A fingerprint is the text's 8-byte SimHash followed by the normalised text (UTF-8). The SimHash estimates the
    cosine cheaply but coarsely: with 64 bits, two questions that share a long frame and differ in their subject
    ("what is the reason a stream is retried on X?" / "... a collection is limited by X?") often land within a
    few bits, a wrong answer served. So the SimHash only prunes: a pair whose estimate is below PRUNE_BELOW scores
    that estimate, any other pair scores its exact cosine, computed from the two texts. Thresholds are therefore
    meant at or above PRUNE_BELOW; `make eval-cache` measures them.

    A text of a few n-grams is not compared (different short texts look alike: "q171" and "q172"), nor one over
    MAX_TEXT_BYTES, which would make every entry of its context that large in the store.
    """

    MIN_GRAMS = 8  # distinct n-grams a text needs to be matched
    MAX_TEXT_BYTES = 4096
    # On the SimHash's scale (1 - angle / pi): an n-gram cosine of 0.85 sits near 0.82, over 2.5 standard
    # deviations of a 64-bit estimate above this line, so true matches are almost never pruned.
    PRUNE_BELOW = 0.7

    def __init__(self, n: int = 3) -> None:
        if n < 1:
            raise ValueError(f"n-gram size must be >= 1, got {n}")
        self.n = n
        self.name = f"simhash{n}-cosine"

    async def fingerprints(self, texts: list[str]) -> list[bytes]:
        return [simhash64(text, self.n).to_bytes(8, "little") + normalised(text).encode() for text in texts]

    def similarity(self, a: bytes, b: bytes) -> float:
        if len(a) <= 8 or len(b) <= 8:
            return 0.0
        estimate = simhash_similarity(int.from_bytes(a[:8], "little"), int.from_bytes(b[:8], "little"))
        if estimate < self.PRUNE_BELOW:
            return estimate
        return ngram_cosine(_counts(a[8:], self.n), _counts(b[8:], self.n))

    def comparable(self, text: str) -> bool:
        normal = normalised(text)
        if len(normal.encode()) > self.MAX_TEXT_BYTES:
            return False
        return len({normal[i : i + self.n] for i in range(len(normal) - self.n + 1)}) >= self.MIN_GRAMS


@functools.lru_cache(maxsize=1024)  # an index compares one query with the same recent entries again and again
def _counts(text: bytes, n: int) -> Counter[str]:
    return ngram_counts(text.decode(errors="replace"), n)
