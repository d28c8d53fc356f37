"""How the gateway's collections look in Milvus: the catalog's and a collection's schema and index, a row as a
document or a hit, and the id expression every read and delete by id uses."""

from __future__ import annotations

from typing import Any

from pymilvus import DataType, MilvusClient

from gateway.search.documents import Document, Hit
from gateway.search.milvus_filter import literal

MAX_TEXT_BYTES = 65_535  # Milvus's longest VARCHAR
FIELDS = ["id", "text", "metadata", "created_at", "updated_at"]


def ids_expression(ids: list[str]) -> str:
    """`id in [...]` with each id an escaped literal: pymilvus' own `get(ids=...)` and `delete(ids=...)` put the
    ids between single quotes unescaped, so an id holding a quote would break out of its string."""
    return "id in [" + ", ".join(literal(i) for i in ids) + "]"


def documents_schema(dimensions: int) -> Any:
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=256)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dimensions)
    schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
    schema.add_field("metadata", DataType.JSON)
    schema.add_field("created_at", DataType.INT64)
    schema.add_field("updated_at", DataType.INT64)
    return schema


def catalog_schema() -> Any:
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("name", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("record", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=2)  # Milvus wants a vector in every collection
    return schema


def hnsw_index(client: MilvusClient, field: str) -> Any:
    index = client.prepare_index_params()
    index.add_index(field_name=field, index_type="HNSW", metric_type="COSINE", params={"M": 16, "efConstruction": 100})
    return index


def hit(row: dict[str, Any]) -> Hit:
    entity = row["entity"]
    return Hit(entity["id"], float(row["distance"]), entity["text"], entity["metadata"])


def document(row: dict[str, Any]) -> Document:
    return Document(row["id"], row["text"], row["metadata"], int(row["created_at"]), int(row["updated_at"]))
