"""The search route writes its answer as JSON directly (the hot path); it must be `SearchResponse`, field for field."""

from __future__ import annotations

import orjson
import pytest

from gateway.protocol.search import SearchResponse
from gateway.routes.search import search_response_json
from gateway.search.documents import Hit
from gateway.services.search import SearchResult


def documented(written: bytes) -> object:
    """The answer as the response model writes it (fields left unset, such as a dense hit's `scores`, left out)."""
    return orjson.loads(SearchResponse.model_validate_json(written).model_dump_json(exclude_none=True))


@pytest.mark.parametrize(
    ("score_type", "scores"), [("cosine", None), ("bm25", None), ("rrf", {"dense": 0.5, "lexical": 7.25})]
)
def test_the_direct_json_is_the_documented_response(score_type: str, scores: dict[str, float] | None) -> None:
    hits = [
        Hit("a", 0.8125, 'first \u4e2d\u6587 "quoted"', {"lang": "zh", "n": 3, "ok": True, "tags": ["x", "y"]}, scores),
        Hit("b", 0.1, "second", {}, scores),
    ]
    result = SearchResult(hits, prompt_tokens=7, cached=False, model="m", score_type=score_type)  # type: ignore[arg-type]
    written = search_response_json("what \u00e9", result)
    assert orjson.loads(written) == documented(written)
    assert list(orjson.loads(written)) == list(SearchResponse.model_fields)  # same keys, same order
    model = SearchResponse.model_validate_json(written)
    assert model.data[0].score == 0.8125 and model.usage.total_tokens == 7
    assert model.data[0].score_type == score_type and model.data[0].scores == scores


def test_no_hits() -> None:
    written = search_response_json("q", SearchResult([], prompt_tokens=1, cached=True, model="m", score_type="cosine"))
    assert orjson.loads(written) == documented(written)
