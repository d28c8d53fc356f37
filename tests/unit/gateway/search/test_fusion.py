"""Hybrid search's fusion: reciprocal ranks, weighted normalised scores, and the checks on what a client sends."""

from __future__ import annotations

import pytest

from gateway.errors import InvalidRequestError
from gateway.search.documents import Hit
from gateway.search.fusion import Fusion, fuse


def hits(*scored: tuple[str, float]) -> list[Hit]:
    return [Hit(document_id, score, document_id, {}) for document_id, score in scored]


DENSE = hits(("a", 0.9), ("b", 0.8), ("c", 0.1))
LEXICAL = hits(("c", 12.0), ("a", 3.0), ("d", 1.0))


def test_rrf_sums_reciprocal_ranks_and_keeps_each_lists_score() -> None:
    fused = fuse({"dense": DENSE, "lexical": LEXICAL}, Fusion("rrf", k=60), top_k=10)
    expected = {"a": 1 / 61 + 1 / 62, "b": 1 / 62, "c": 1 / 63 + 1 / 61, "d": 1 / 63}
    assert [h.id for h in fused] == ["a", "c", "b", "d"]
    assert {h.id: h.score for h in fused} == pytest.approx(expected)
    assert fused[1].scores == {"dense": 0.1, "lexical": 12.0} and fused[2].scores == {"dense": 0.8}


def test_weighted_scales_each_list_to_its_own_range() -> None:
    fused = fuse({"dense": DENSE, "lexical": LEXICAL}, Fusion("weighted", weights={"dense": 2.0}), top_k=2)
    # dense: a 1, b 0.875, c 0; lexical: c 1, a 2/11, d 0
    assert [(h.id, round(h.score, 4)) for h in fused] == [("a", round(2 + 2 / 11, 4)), ("b", 1.75)]


def test_a_weight_of_zero_leaves_one_list_out_and_an_empty_list_changes_nothing() -> None:
    for method in ("rrf", "weighted"):
        only_lexical = fuse({"dense": DENSE, "lexical": LEXICAL}, Fusion(method, weights={"dense": 0}), top_k=2)
        assert [h.id for h in only_lexical] == ["c", "a"], method  # (d scores 0 in weighted, as b does)
        alone = fuse({"dense": DENSE, "lexical": []}, Fusion(method), top_k=3)
        assert [h.id for h in alone] == ["a", "b", "c"], method


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"method": "sum"}, "fusion.method"),
        ({"k": 0}, "fusion.k"),
        ({"candidates": 1001}, "fusion.candidates"),
        ({"weights": {"dense": -1}}, "fusion.weights"),
        ({"weights": {"dense": float("nan")}}, "fusion.weights"),
        ({"weights": {"sparse": 1}}, "fusion.weights"),
        ({"weights": {"dense": 0, "lexical": 0}}, "fusion.weights"),
    ],
)
def test_bad_fusion_is_refused_naming_the_field(fields: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        Fusion(**fields)  # type: ignore[arg-type]
    assert refused.value.param == param
