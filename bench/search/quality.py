"""Retrieval quality of ranked answers to labelled queries: recall@1, recall@10 and MRR, and the same for exact
brute-force cosine search over the same vectors (the reference an ANN engine is held to)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]
CHUNK = 1024  # queries scored at once: bounds the score matrix's memory


def quality(ranked: Sequence[Sequence[int]], answers: Sequence[int], top_k: int = 10) -> dict[str, float]:
    """`ranked[i]`: the document indices answered to query i, best first; `answers[i]`: the right one."""
    first = within = reciprocal = 0.0
    for found, answer in zip(ranked, answers, strict=True):
        rank = next((position for position, index in enumerate(found[:top_k]) if index == answer), None)
        if rank is not None:
            within += 1
            reciprocal += 1 / (rank + 1)
            first += rank == 0
    count = max(len(answers), 1)
    return {"recall@1": first / count, f"recall@{top_k}": within / count, "mrr": reciprocal / count}


def exact_ranked(documents: Vectors, queries: Vectors, top_k: int = 10) -> list[list[int]]:
    """Each query's top_k documents by exact cosine similarity (the vectors are unit length), best first."""
    ranked: list[list[int]] = []
    for start in range(0, len(queries), CHUNK):
        scores = queries[start : start + CHUNK] @ documents.T
        k = min(top_k, documents.shape[0])
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.take_along_axis(scores, top, axis=1).argsort(axis=1)[:, ::-1]
        ranked += np.take_along_axis(top, order, axis=1).tolist()
    return ranked


def overlap(ranked: Sequence[Sequence[int]], exact: Sequence[Sequence[int]], top_k: int = 10) -> float:
    """Share of the exact top_k that the engine also answered (ANN recall against exact search)."""
    hits = sum(len(set(found[:top_k]) & set(truth[:top_k])) for found, truth in zip(ranked, exact, strict=True))
    return hits / max(sum(min(top_k, len(truth)) for truth in exact), 1)


def unit(vectors: Vectors) -> Vectors:
    normalised: Vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    return normalised
