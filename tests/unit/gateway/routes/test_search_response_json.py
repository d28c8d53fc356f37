"""The search route writes its answer as JSON directly (the hot path); it must be `SearchResponse`, field for field."""

from __future__ import annotations

import orjson

from gateway.protocol.search import SearchResponse
from gateway.routes.search import search_response_json
from gateway.search.documents import Hit
from gateway.services.search import SearchResult


def test_the_direct_json_is_the_documented_response() -> None:
    hits = [
        Hit("a", 0.8125, 'first \u4e2d\u6587 "quoted"', {"lang": "zh", "n": 3, "ok": True, "tags": ["x", "y"]}),
        Hit("b", 0.1, "second", {}),
    ]
    result = SearchResult(hits, prompt_tokens=7, cached=False, model="m")
    written = search_response_json("what \u00e9", result)
    model = SearchResponse.model_validate_json(written)
    assert orjson.loads(written) == orjson.loads(model.model_dump_json())
    assert list(orjson.loads(written)) == list(SearchResponse.model_fields)  # same keys, same order
    assert model.data[0].score == 0.8125 and model.usage.total_tokens == 7


def test_no_hits() -> None:
    written = search_response_json("q", SearchResult([], prompt_tokens=1, cached=True, model="m"))
    assert orjson.loads(written) == orjson.loads(SearchResponse.model_validate_json(written).model_dump_json())
