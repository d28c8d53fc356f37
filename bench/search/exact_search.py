"""Exact search in every mode over the stored documents, the reference the store's answers are held to.

- dense: cosine over every stored vector (numpy; the vectors are unit length);
- lexical: BM25 over every document's stored terms with the formula of the store's full-text index (Qdrant's
  `TextQuery`, checked against it by the scale step): for each distinct query term t in a document,
  idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / mean length)), idf(t) = ln(1 + (N - n + 0.5) /
  (n + 0.5)), N the documents with terms (one without any is not in the index), n those holding t, lengths in
  terms; k1 1.2, b 0.75 (Qdrant's defaults, which the store's lexical search uses). Only documents holding a query
  term are answers;
- hybrid: the exact dense and the exact lexical candidates fused by the gateway's own `fuse`, the way
  `gateway/services/search_query.py` fuses the store's (max(top_k, fusion.candidates) of each list).

Scores are over all documents; `allowed` (a filter's documents) keeps only some as answers, as a filter does in
the store: the statistics (N, n, the mean length) stay the whole collection's.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import sparse

from gateway.search.documents import Hit
from gateway.search.fusion import Fusion, fuse

K1 = 1.2
B = 0.75
TIE = 1e-5  # scores this close to the last exact one are ties with it: either document is a right answer
Scores = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]


class Bm25:
    """Term frequencies of every document (a sparse documents x terms matrix), scored exhaustively."""

    def __init__(self, terms: Sequence[str]) -> None:
        vocabulary: dict[str, int] = {}
        rows, columns = array("i"), array("i")
        lengths = np.zeros(len(terms), dtype=np.float64)
        for row, text in enumerate(terms):
            split = text.split()
            lengths[row] = len(split)
            rows.extend([row] * len(split))
            columns.extend(vocabulary.setdefault(term, len(vocabulary)) for term in split)
        counts = np.ones(len(rows), dtype=np.float64)
        shape = (len(terms), max(len(vocabulary), 1))
        self._frequencies = sparse.csc_matrix((counts, (np.asarray(rows), np.asarray(columns))), shape=shape)
        self._frequencies.sum_duplicates()  # a term written twice in a document counts twice
        self._vocabulary = vocabulary
        indexed = lengths > 0
        self._indexed = int(indexed.sum())  # the engine's N: documents without terms are outside its index
        mean = float(lengths[indexed].mean()) if self._indexed else 1.0
        self._norms = K1 * (1 - B + B * lengths / mean)

    @property
    def documents(self) -> int:
        return int(self._frequencies.shape[0])

    def scores(self, query_terms: str) -> Scores:
        """Every document's score for the analyzed query (0 where it holds none of the terms); each distinct
        term counts once, as in the store."""
        scores = np.zeros(self.documents, dtype=np.float64)
        matrix = self._frequencies
        for term in dict.fromkeys(query_terms.split()):
            column = self._vocabulary.get(term)
            if column is None:
                continue
            start, end = matrix.indptr[column], matrix.indptr[column + 1]
            rows, frequencies = matrix.indices[start:end], matrix.data[start:end]
            idf = math.log(1 + (self._indexed - len(rows) + 0.5) / (len(rows) + 0.5))
            scores[rows] += idf * frequencies * (K1 + 1) / (frequencies + self._norms[rows])
        return scores


def best(scores: Scores, k: int, allowed: Mask | None = None, *, matched_only: bool = False) -> list[int]:
    """The indices of the k best scores, best first (ties by index); `matched_only`: above 0 only (lexical)."""
    candidates = scores if allowed is None else np.where(allowed, scores, -np.inf)
    if matched_only:
        candidates = np.where(candidates > 0, candidates, -np.inf)
    k = min(k, int(np.isfinite(candidates).sum()))
    if k <= 0:
        return []
    top = np.argpartition(-candidates, k - 1)[:k]
    return sorted(top.tolist(), key=lambda i: (-candidates[i], i))


@dataclass
class ExactHybrid:
    """One query's exact hybrid answer and the exact fused score of any document, for ties at the cut."""

    hits: list[Hit]  # the exact top_k, fused; ids are document indices as text
    dense: Scores
    lexical: Scores
    lists: dict[str, list[Hit]]  # the fused candidates of each list
    fusion: Fusion

    def score(self, index: int) -> float:
        """What `fuse` gives document `index` against the exact lists (weighted fusion): a document level with a
        list's last candidate counts as that candidate, one below it as absent."""
        total = 0.0
        for source, scores in (("dense", self.dense), ("lexical", self.lexical)):
            hits = self.lists[source]
            if not hits or (source == "lexical" and scores[index] <= 0) or scores[index] < hits[-1].score - TIE:
                continue
            low, high = hits[-1].score, hits[0].score
            normalised = 1.0 if high == low else (float(scores[index]) - low) / (high - low)
            total += self.fusion.weight(source) * min(max(normalised, 0.0), 1.0)
        return total


def exact_hybrid(dense: Scores, lexical: Scores, top_k: int, fusion: Fusion, allowed: Mask | None) -> ExactHybrid:
    depth = max(top_k, fusion.candidates)
    lists = {
        "dense": [Hit(str(i), float(dense[i]), "", {}) for i in best(dense, depth, allowed)],
        "lexical": [Hit(str(i), float(lexical[i]), "", {}) for i in best(lexical, depth, allowed, matched_only=True)],
    }
    return ExactHybrid(fuse(lists, fusion, top_k), dense, lexical, lists, fusion)


def dense_matches(found: Sequence[int], dense: Scores, exact: Sequence[int]) -> int:
    """How many found documents belong to the exact top len(exact): in it, or level with its last."""
    if not exact:
        return 0
    last, members = float(dense[exact[-1]]), set(exact)
    return sum(1 for i in found[: len(exact)] if i in members or dense[i] >= last - TIE)


def hybrid_matches(found: Sequence[int], exact: ExactHybrid) -> int:
    if not exact.hits:
        return 0
    last, members = exact.hits[-1].score, {int(hit.id) for hit in exact.hits}
    return sum(1 for i in found[: len(exact.hits)] if i in members or exact.score(i) >= last - TIE)


def lexical_matches(found: Sequence[int], lexical: Scores, exact: Sequence[int]) -> int:
    """As `dense_matches`, for BM25 (found documents holding no query term never match)."""
    if not exact:
        return 0
    last, members = float(lexical[exact[-1]]), set(exact)
    return sum(1 for i in found[: len(exact)] if i in members or (lexical[i] > 0 and lexical[i] >= last - TIE))
