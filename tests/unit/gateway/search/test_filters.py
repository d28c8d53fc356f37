"""The filter language: what it accepts, the 400 it answers otherwise, the Milvus text it writes, and the search
breadth each store searches with (SEARCH_HNSW_EF, wider with a filter in the embedded store)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from gateway.errors import InvalidRequestError
from gateway.search.embedded import EmbeddedStore
from gateway.search.embedded_points import HNSW_EF_FILTERED, search_request
from gateway.search.filters import All, Any_, Compare, Member, parse_filter
from gateway.search.milvus import MilvusStore
from gateway.search.milvus_filter import literal, to_milvus
from gateway.search.milvus_rows import dense_params
from gateway.search.store import HNSW_EF
from gateway.search.stores import build_vector_store
from gateway.settings import SearchSettings


def test_implicit_equality_and_operators_parse_to_the_tree() -> None:
    assert parse_filter({"lang": "zh"}) == Compare("lang", "$eq", "zh")
    assert parse_filter({"price": {"$gte": 10, "$lt": 100}}) == All(
        (Compare("price", "$gte", 10), Compare("price", "$lt", 100))
    )
    assert parse_filter({"$or": [{"a": 1}, {"b": {"$nin": ["x", "y"]}}]}) == Any_(
        (Compare("a", "$eq", 1), Member("b", "$nin", ("x", "y")))
    )


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ({"price": {"$lt": "100"}}, "filter.price.$lt"),
        ({"price": {"$regex": "a"}}, "filter.price.$regex"),
        ({"$not": {"a": 1}}, "filter.$not"),
        ({"tags": {"$in": []}}, "filter.tags.$in"),
        ({"tags": {"$in": [["a"]]}}, "filter.tags.$in[0]"),
        ({"a": None}, "filter.a"),
        ({"a": {"b": 1}}, "filter.a.b"),
        ({"a.b": 1}, "filter.a.b"),
        ({'a"]': 1}, 'filter.a"]'),
        ({"$and": {}}, "filter.$and"),
        ({"$or": [{}]}, "filter.$or[0]"),
        ({"flag": {"$gt": True}}, "filter.flag.$gt"),
        ([], "filter"),
    ],
)
def test_a_malformed_filter_is_refused_naming_the_field(raw: Any, names: str) -> None:
    with pytest.raises(InvalidRequestError) as error:
        parse_filter(raw)
    assert error.value.message.startswith(f"{names}:"), error.value.message
    assert error.value.param == "filter"
    assert error.value.status_code == 400


def test_deep_or_large_filters_are_refused() -> None:
    deep: dict[str, Any] = {"a": 1}
    for _ in range(12):
        deep = {"$and": [deep]}
    with pytest.raises(InvalidRequestError, match="nest at most"):
        parse_filter(deep)
    with pytest.raises(InvalidRequestError, match="at most 64 conditions"):
        parse_filter({"$or": [{"a": n} for n in range(65)]})


def test_milvus_literals_escape_quotes_backslashes_and_line_breaks() -> None:
    assert literal('x" or 1==1 or "') == '"x\\" or 1==1 or \\""'
    assert literal("a\\b\nc") == '"a\\\\b\\nc"'
    assert literal(True) == "true"
    assert literal(3) == "3.0"


def test_milvus_expression_keeps_values_inside_their_literals() -> None:
    expression = to_milvus(parse_filter({"lang": 'x" or 1==1 or "', "n": {"$lt": 5}}))
    assert expression == (
        '((metadata["lang"] == "x\\" or 1==1 or \\"" or json_contains(metadata["lang"], "x\\" or 1==1 or \\""))'
        ' and (metadata["n"] < 5.0))'
    )


def test_a_filtered_search_walks_the_graph_wider() -> None:
    """A filter prunes the HNSW walk, so it gets the wider breadth that keeps its recall unless SEARCH_HNSW_EF
    asks for more; top_k above the breadth widens either."""
    vector = np.ones(4, dtype=np.float32)
    bucket = parse_filter({"bucket": 1})
    assert HNSW_EF < HNSW_EF_FILTERED
    assert search_request(vector, 10, None, None, HNSW_EF).params.hnsw_ef == HNSW_EF
    assert search_request(vector, 10, bucket, None, HNSW_EF).params.hnsw_ef == HNSW_EF_FILTERED
    assert search_request(vector, 10, None, None, 300).params.hnsw_ef == 300
    assert search_request(vector, 10, bucket, None, 300).params.hnsw_ef == 300
    assert search_request(vector, HNSW_EF + 1, None, None, HNSW_EF).params.hnsw_ef == HNSW_EF + 1
    assert dense_params("HNSW", 10, 300) == {"metric_type": "COSINE", "params": {"ef": 300}}
    assert dense_params("HNSW", 400, 300)["params"] == {"ef": 400}
    assert dense_params("AUTOINDEX", 10, 300)["params"] == {}


def test_search_hnsw_ef_reaches_either_store(tmp_path: Path) -> None:
    embedded = build_vector_store(SearchSettings(path=str(tmp_path), hnsw_ef=300))
    milvus = build_vector_store(SearchSettings(milvus_uri="http://127.0.0.1:9", hnsw_ef=300))
    assert isinstance(embedded, EmbeddedStore) and isinstance(milvus, MilvusStore)
    assert embedded._hnsw_ef == milvus._hnsw_ef == 300
    with pytest.raises(ValidationError):
        SearchSettings(hnsw_ef=0)
