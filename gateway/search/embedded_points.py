"""The embedded store's documents as Qdrant Edge points, and the synchronous shard calls that read and write them
(run in the store's threads).

A document is one point: its id is a UUID derived from the client's id, its payload holds the client's id, the
text, the metadata, the timestamps and the analyzer's terms (`terms`, under Qdrant's full-text index with BM25
scoring: lexical search is the engine's own), so a search answers in one call. Every write is flushed before the call
returns, and kept too while a copy of the shard is being indexed (`shard_index.py` replays them on the copy).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from qdrant_edge import (
    CountRequest,
    EdgeShard,
    PayloadSchemaType,
    Point,
    PointVectors,
    Query,
    QueryRequest,
    SearchParams,
    TextIndexParams,
    TextQuery,
    TextScoringParams,
    TextScoringType,
    TokenizerType,
    UpdateOperation,
)

from gateway.search.documents import Document, Hit, Vector
from gateway.search.filters import Filter
from gateway.search.qdrant_filter import flags, payload_indexes, to_qdrant
from gateway.search.store import DocumentWrite, IndexUpdate

PointId = int | uuid.UUID | str
ID_NAMESPACE = uuid.UUID("6f1c1a52-4d0e-4a8e-9a53-2d3f7f1e0c11")  # fixed: ids must map the same way forever
# Search breadth (SEARCH_HNSW_EF), docs/benchmarks.md has the recall each buys: a filter prunes the graph walk,
# so it needs more.
HNSW_EF_FILTERED = 200
Kept = list[UpdateOperation] | None  # the writes kept for an index build under way, if any
TERMS = "terms"
# The analyzer has done the work (gateway/search/analyzer.py): the engine only splits on spaces and counts.
TERMS_INDEX = TextIndexParams(
    tokenizer=TokenizerType.Whitespace,
    lowercase=False,
    max_token_len=None,
    scoring=TextScoringParams(type=TextScoringType.Bm25),
)
HIT_FIELDS = ["id", "text", "metadata"]  # what a search reads back (never the terms)
DOCUMENT_FIELDS = [*HIT_FIELDS, "created_at", "updated_at"]


def point_id(document_id: str) -> str:
    return str(uuid.uuid5(ID_NAMESPACE, document_id))


def search_request(
    vector: Vector, top_k: int, where: Filter | None, min_score: float | None, hnsw_ef: int
) -> QueryRequest:
    breadth = hnsw_ef if where is None else max(hnsw_ef, HNSW_EF_FILTERED)
    return QueryRequest(
        limit=top_k,
        query=Query.Nearest(vector.tolist()),
        filter=to_qdrant(where) if where is not None else None,
        with_payload=HIT_FIELDS,
        score_threshold=min_score,
        params=SearchParams(hnsw_ef=max(breadth, top_k)),
    )


def lexical_request(terms: str, top_k: int, where: Filter | None, min_score: float | None) -> QueryRequest:
    return QueryRequest(
        limit=top_k,
        query=TextQuery(TERMS, terms),
        filter=to_qdrant(where) if where is not None else None,
        with_payload=HIT_FIELDS,
        score_threshold=min_score,
    )


def query(shard: EdgeShard, request: QueryRequest) -> list[Hit]:
    """The hits, made here in the store's thread rather than on the event loop: each point's payload becomes
    Python objects when it is read, so it is read once."""
    return [hit(point.score, payload) for point in shard.query(request) if (payload := point.payload)]


def set_index(shard: EdgeShard, updates: dict[str, IndexUpdate], kept: Kept) -> None:
    index_terms(shard, kept)
    vectors = [PointVectors(point_id(i), u.vector.tolist()) for i, u in updates.items() if u.vector is not None]
    operations = [UpdateOperation.update_vectors(vectors)] if vectors else []
    operations += [UpdateOperation.set_payload([point_id(i)], {TERMS: u.terms}) for i, u in updates.items()]
    for operation in operations:
        shard.update(operation)
    shard.flush()
    if kept is not None:
        kept.extend(operations)


def upsert(shard: EdgeShard, documents: Sequence[DocumentWrite], now: int, kept: Kept) -> None:
    index_fields(shard, documents, kept)
    ids: list[PointId] = [point_id(d.id) for d in documents]
    existing = shard.retrieve(ids, ["id", "created_at"], False)
    created = {r.payload["id"]: r.payload["created_at"] for r in existing if r.payload}
    points = [
        Point(
            key,
            d.vector.tolist(),
            {
                "id": d.id,
                "text": d.text,
                "metadata": d.metadata,
                "flags": flags(d.metadata),
                "created_at": created.get(d.id, now),
                "updated_at": now,
                TERMS: d.terms,
            },
        )
        for key, d in zip(ids, documents, strict=True)
    ]
    apply(shard, UpdateOperation.upsert_points(points), kept)


def index_fields(shard: EdgeShard, documents: Sequence[DocumentWrite], kept: Kept) -> None:
    """A payload index for each metadata field as it first appears (a field seen later with another type is
    filtered without one), so that filtered searches stay fast; and the terms' index."""
    wanted: dict[str, PayloadSchemaType | TextIndexParams] = {}
    for document in documents:
        for path, schema in payload_indexes(document.metadata).items():
            wanted.setdefault(path, schema)
    wanted[TERMS] = TERMS_INDEX
    existing = shard.info().payload_schema
    for path, index in wanted.items():
        if path not in existing:
            apply(shard, UpdateOperation.create_field_index(path, index), kept)


def index_terms(shard: EdgeShard, kept: Kept) -> None:
    """The terms' full-text index, on a shard written before lexical search (its first re-index makes it)."""
    if TERMS not in shard.info().payload_schema:
        apply(shard, UpdateOperation.create_field_index(TERMS, TERMS_INDEX), kept)


def delete_ids(shard: EdgeShard, ids: list[PointId], kept: Kept) -> int:
    found = [record.id for record in shard.retrieve(ids, False, False)]
    if found:
        apply(shard, UpdateOperation.delete_points(found), kept)
    return len(found)


def delete_filter(shard: EdgeShard, where: Filter, kept: Kept) -> int:
    compiled = to_qdrant(where)
    count = shard.count(CountRequest(exact=True, filter=compiled))
    if count:
        apply(shard, UpdateOperation.delete_points_by_filter(compiled), kept)
    return int(count)


def apply(shard: EdgeShard, operation: UpdateOperation, kept: Kept) -> None:
    """Apply and flush a write; keep it too while a copy of the shard is being indexed."""
    shard.update(operation)
    shard.flush()
    if kept is not None:
        kept.append(operation)


def document(payload: dict[str, Any]) -> Document:
    return Document(payload["id"], payload["text"], payload["metadata"], payload["created_at"], payload["updated_at"])


def hit(score: float, payload: dict[str, Any]) -> Hit:
    return Hit(payload["id"], float(score), payload["text"], payload["metadata"])
