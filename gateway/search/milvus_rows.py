"""How the gateway's collections look in Milvus: the catalog's and a collection's schema and indexes, a row as a
document or a hit, and the id expression every read and delete by id uses.

A collection made on a Milvus with full text search (2.5 and later) also holds the analyzer's terms (`terms`,
split on spaces by Milvus's whitespace tokenizer) and Milvus's BM25 function over them (`sparse`, the
engine's own BM25, k1 1.2 and b 0.75 as in the embedded store): the gateway analyzes, Milvus counts and scores.
"""

from __future__ import annotations

from typing import Any, Literal

from pymilvus import DataType, Function, FunctionType, MilvusClient

from gateway.search.documents import Document, Hit
from gateway.search.milvus_filter import literal

CATALOG = "gateway_collections"
MAX_TEXT_BYTES = 65_535  # Milvus's longest VARCHAR
FIELDS = ["id", "text", "metadata", "created_at", "updated_at"]
TERMS = "terms"
SPARSE = "sparse"  # the BM25 function's output: what a lexical search searches
BM25_PARAMS = {"bm25_k1": 1.2, "bm25_b": 0.75}  # Qdrant Edge's, so both stores score alike
VectorIndex = Literal["HNSW", "AUTOINDEX"]


def milvus_name(name: str) -> str:
    """A collection's Milvus name: `_` -> `_0`, `-` -> `_1` keeps names distinct."""
    return "gw_" + name.replace("_", "_0").replace("-", "_1")


def ids_expression(ids: list[str]) -> str:
    """`id in [...]` with each id an escaped literal: pymilvus' own `get(ids=...)` and `delete(ids=...)` put the
    ids between single quotes unescaped, so an id holding a quote would break out of its string."""
    return "id in [" + ", ".join(literal(i) for i in ids) + "]"


def documents_schema(dimensions: int, lexical: bool) -> Any:
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=256)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dimensions)
    schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
    schema.add_field("metadata", DataType.JSON)
    schema.add_field("created_at", DataType.INT64)
    schema.add_field("updated_at", DataType.INT64)
    if lexical:
        schema.add_field(
            TERMS,
            DataType.VARCHAR,
            max_length=MAX_TEXT_BYTES,
            enable_analyzer=True,
            analyzer_params={"tokenizer": "whitespace"},
        )
        schema.add_field(SPARSE, DataType.SPARSE_FLOAT_VECTOR)
        bm25 = Function("bm25", FunctionType.BM25, input_field_names=TERMS, output_field_names=SPARSE)
        schema.add_function(bm25)
    return schema


def bounded_terms(terms: str) -> str:
    """The terms that fit Milvus's longest VARCHAR, cut at a space: a longer document's lexical index holds its
    first terms (a chunked collection's chunks are far shorter)."""
    encoded = terms.encode()
    if len(encoded) <= MAX_TEXT_BYTES:
        return terms
    return encoded[: MAX_TEXT_BYTES + 1].decode(errors="ignore").rpartition(" ")[0]


def catalog_schema() -> Any:
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("name", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("record", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=2)  # Milvus wants a vector in every collection
    return schema


def vector_index(client: MilvusClient, kind: VectorIndex, *, lexical: bool = False) -> Any:
    index = client.prepare_index_params()
    params = {"M": 16, "efConstruction": 100} if kind == "HNSW" else {}
    index.add_index(field_name="vector", index_type=kind, metric_type="COSINE", params=params)
    if lexical:
        index.add_index(field_name=SPARSE, index_type="SPARSE_INVERTED_INDEX", metric_type="BM25", params=BM25_PARAMS)
    return index


def dense_params(kind: VectorIndex, top_k: int, hnsw_ef: int) -> dict[str, Any]:
    params = {"ef": max(hnsw_ef, top_k)} if kind == "HNSW" else {}
    return {"metric_type": "COSINE", "params": params}


def hit(row: dict[str, Any]) -> Hit:
    entity = row["entity"]
    return Hit(entity["id"], float(row["distance"]), entity["text"], entity["metadata"])


def document(row: dict[str, Any]) -> Document:
    return Document(row["id"], row["text"], row["metadata"], int(row["created_at"]), int(row["updated_at"]))
