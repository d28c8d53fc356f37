"""How two questions are compared: a matcher turns texts into fingerprints and scores a pair of them.

`EmbeddingMatcher` scores the cosine of embedding vectors from a `TextEmbedder` it is
given at wiring (the gateway passes its embedding service); `SimHashMatcher` scores
the share of equal bits of two SimHashes and needs no model.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from gateway.cache.semantic.simhash import simhash64, simhash_similarity


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
    """Share of equal bits of two 64-bit SimHashes over character n-grams; a fingerprint is 8 bytes.

    A text of a few n-grams is not compared: each bit is then a vote of a few +-1 and often a tie (0 in both
    hashes), so different short texts look alike ("q171" and "q172" score 0.906, above the 0.88 default).
    """

    MIN_GRAMS = 8  # distinct n-grams a text needs to be matched

    def __init__(self, n: int = 3) -> None:
        if n < 1:
            raise ValueError(f"n-gram size must be >= 1, got {n}")
        self.n = n
        self.name = f"simhash{n}"

    async def fingerprints(self, texts: list[str]) -> list[bytes]:
        return [simhash64(text, self.n).to_bytes(8, "little") for text in texts]

    def similarity(self, a: bytes, b: bytes) -> float:
        if len(a) != 8 or len(b) != 8:
            return 0.0
        return simhash_similarity(int.from_bytes(a, "little"), int.from_bytes(b, "little"))

    def comparable(self, text: str) -> bool:
        normal = " ".join(text.lower().split())
        return len({normal[i : i + self.n] for i in range(len(normal) - self.n + 1)}) >= self.MIN_GRAMS
