"""The scale step's varied texts and exact references on tiny inputs; the BM25 against Qdrant Edge's own, in
process (a shard of eight points)."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from qdrant_edge import (
    Distance,
    EdgeConfig,
    EdgeShard,
    EdgeVectorParams,
    Point,
    QueryRequest,
    TextQuery,
    UpdateOperation,
)

from bench.search.exact_search import Bm25, best, dense_matches, exact_hybrid, hybrid_matches
from bench.search.scale_texts import VariedTexts
from gateway.search.analyzer import analyze
from gateway.search.embedded_points import TERMS, TERMS_INDEX
from gateway.search.fusion import Fusion, fuse

DOCUMENTS = ["The cat sat on the mat near the door", "他们在公园里散步聊天", "Stocks fell sharply on Monday morning"]
LANGUAGES = ["en", "zh", "en"]


def test_varied_texts_are_seeded_per_index_and_keep_their_source_language() -> None:
    texts = VariedTexts(DOCUMENTS, LANGUAGES)
    again = VariedTexts(DOCUMENTS, LANGUAGES)
    assert [texts(j) for j in range(30)] == [again(j) for j in range(30)]  # the j-th text whatever the count
    assert texts(4) != texts(7) and texts(4) != DOCUMENTS[1]
    assert " " not in texts(1) and " " in texts(0)  # Chinese written without spaces, English with
    assert VariedTexts(DOCUMENTS, LANGUAGES, seed=12)(0) != texts(0)


def test_variants_of_one_source_rarely_share_their_terms() -> None:
    documents = [" ".join(f"t{i}x{k}" for k in range(12)) for i in range(100)]
    texts = VariedTexts(documents, ["en"] * len(documents))
    variants = [tuple(sorted(Counter(analyze(texts(100 * j)).split()).items())) for j in range(300)]
    assert len(set(variants)) >= 297  # a shared bag of terms would be a BM25 tie for every query
    assert all(texts(100 * j) != documents[0] for j in range(300))


def test_bm25_scores_as_qdrant_edges_full_text_index(tmp_path: Path) -> None:
    terms = ["a b c", "a a d e f", "b c d", "a", "x y z w v u", "", "c c c d", "a b"]  # "": no terms, not counted
    shard = EdgeShard.create(str(tmp_path), EdgeConfig(vectors=EdgeVectorParams(size=2, distance=Distance.Cosine)))
    try:
        shard.update(UpdateOperation.create_field_index(TERMS, TERMS_INDEX))
        points = [Point(str(uuid.UUID(int=i)), [1.0, 0.0], {TERMS: t}) for i, t in enumerate(terms)]
        shard.update(UpdateOperation.upsert_points(points))
        found = shard.query(QueryRequest(limit=10, query=TextQuery(TERMS, "a a c")))
        answered = {uuid.UUID(str(point.id)).int: point.score for point in found}
    finally:
        shard.close()
    scores = Bm25(terms).scores("a a c")  # a term asked twice counts once, as in the engine
    assert set(answered) == {i for i in range(len(terms)) if scores[i] > 0}  # every document with a term
    assert all(answered[i] == pytest.approx(scores[i], rel=1e-6) for i in answered)
    assert best(scores, 3, matched_only=True) == sorted(answered, key=lambda i: -answered[i])[:3]


def test_exact_hybrid_fuses_the_exact_lists_and_counts_a_tie_at_the_cut_as_right() -> None:
    dense = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.1])
    lexical = np.array([0.0, 2.0, 0.0, 3.0, 1.0, 1.0])  # documents 4 and 5 tie on words
    fusion = Fusion(candidates=3)
    exact = exact_hybrid(dense, lexical, 3, fusion, None)
    lists = {
        "dense": [exact.lists["dense"][i] for i in range(3)],
        "lexical": [exact.lists["lexical"][i] for i in range(3)],
    }
    assert [h.id for h in exact.hits] == [h.id for h in fuse(lists, fusion, 3)]
    assert [h.id for h in lists["lexical"]] == ["3", "1", "4"]  # the tie broken by index, as `best` does
    assert exact.score(5) == pytest.approx(exact.score(4))  # level with the last candidate: as good as it
    assert hybrid_matches([1, 3, 0], exact) == 3
    assert hybrid_matches([2, 3, 5], exact) == sum(i in {int(h.id) for h in exact.hits} for i in (2, 3, 5))
    assert dense_matches([0, 1, 5], dense, best(dense, 3)) == 2
    allowed = np.array([False, True, True, True, True, True])
    assert best(dense, 2, allowed) == [1, 2]
