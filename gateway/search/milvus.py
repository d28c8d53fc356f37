"""The Milvus vector store: collections in a Milvus server, shared by every replica, through pymilvus.

    gateway_collections        the catalog: one row per collection (its record as JSON)
    gw_<name>                  one Milvus collection per collection: id (primary key), vector (cosine; HNSW, or
                               AUTOINDEX as SEARCH_MILVUS_INDEX says), text, metadata (JSON), created_at,
                               updated_at; on Milvus 2.5 and later also terms and their BM25 (`milvus_rows.py`),
                               what lexical search searches

Collection names are encoded for Milvus (`_` -> `_0`, `-` -> `_1`), which keeps them distinct. A document is
searchable, from every replica, when its upsert returns: each read states its own consistency, from the last
write's timestamp of its collection (`milvus_clock.py`: no wait on a collection not written to within the minute,
at most a time tick right after a write), so collections keep the Strong level they are created with for other
clients, old ones included. Bulk writes are flushed once they go quiet, so their rows are searched through the
HNSW index (`milvus_flush.py`). The client connects on first use, not at start, so a gateway whose Milvus is down
starts and serves everything else; every call runs on the store's thread pool with SEARCH_MILVUS_TIMEOUT_SECONDS.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pydantic import SecretStr
from pymilvus import MilvusClient

from gateway.errors import InvalidRequestError
from gateway.observability import quiet_pymilvus
from gateway.redis_client import RedisConnection
from gateway.search import chunks
from gateway.search.documents import Collection, Document, Hit, Vector
from gateway.search.filters import Filter
from gateway.search.milvus_clock import STRONG, ReadLevel, WriteClock
from gateway.search.milvus_filter import literal, to_milvus
from gateway.search.milvus_flush import QuietFlush
from gateway.search.milvus_rows import (
    FIELDS,
    MAX_TEXT_BYTES,
    SPARSE,
    TERMS,
    VectorIndex,
    bounded_terms,
    catalog_schema,
    dense_params,
    document,
    documents_schema,
    hit,
    ids_expression,
    vector_index,
)
from gateway.search.store import (
    CollectionExistsError,
    CollectionNotFoundError,
    DocumentWrite,
    IndexUpdate,
    LexicalSearchUnavailableError,
    SearchStoreUnavailableError,
)
from gateway.search.threads import StoreThreads

quiet_pymilvus()

T = TypeVar("T")
CATALOG = "gateway_collections"
FULL_TEXT_SEARCH = (2, 5)  # the Milvus release that brought the BM25 function
CATALOG_TTL_SECONDS = 5.0  # how long this replica trusts its copy of a collection's record


def milvus_name(name: str) -> str:
    return "gw_" + name.replace("_", "_0").replace("-", "_1")


class MilvusStore:
    name = "milvus"

    def __init__(
        self,
        uri: str,
        token: SecretStr | None,
        *,
        timeout_seconds: float = 10.0,
        max_threads: int = 4,
        redis: str | RedisConnection | None = None,
        flush_after_rows: int = 1000,
        flush_quiet_seconds: float = 5.0,
        index: VectorIndex = "HNSW",
    ) -> None:
        self._uri = uri
        self._index = index
        self._full_text = False  # the server's, known once connected
        self._lexical: dict[str, bool] = {}  # by Milvus collection: whether it was made with terms and BM25
        self._token = token
        self._timeout = timeout_seconds
        self._threads = StoreThreads(self.name, max_threads)
        self._client: MilvusClient | None = None
        self._records: dict[str, tuple[Collection, float]] = {}
        self._clock = WriteClock(redis, uri)
        self.flushes = QuietFlush(self._flush, min_rows=flush_after_rows, quiet_seconds=flush_quiet_seconds)

    async def create_collection(self, collection: Collection) -> None:
        await self._clock.wrote(CATALOG, await self._run(self._create, collection))
        self._records[collection.name] = (collection, time.monotonic() + CATALOG_TTL_SECONDS)

    async def collection(self, name: str) -> Collection:
        return await self._record(name)

    async def lexical(self, name: str | None = None) -> bool:
        if name is None:
            return await self._run(self._has_full_text)
        target = milvus_name(name)
        if target not in self._lexical:
            self._lexical[target] = await self._run(self._has_terms, target)
        return self._lexical[target]

    async def get_collection(self, name: str) -> Collection:
        collection = await self._record(name, fresh=True)
        return collection.counted(await self._counted(milvus_name(name), collection))

    async def list_collections(self) -> list[Collection]:
        records = await self._run(self._catalog_rows, "", await self._clock.level(CATALOG))
        counted = []
        for record in records:
            collection = Collection.from_record(record)
            counted.append(collection.counted(await self._counted(milvus_name(collection.name), collection)))
        return sorted(counted, key=lambda c: c.name)

    async def update_collection(self, collection: Collection) -> None:
        await self._record(collection.name, fresh=True)
        await self._clock.wrote(CATALOG, await self._run(self._write_record, collection))
        self._records[collection.name] = (collection, time.monotonic() + CATALOG_TTL_SECONDS)

    async def delete_collection(self, name: str) -> None:
        await self._record(name, fresh=True)
        self._records.pop(name, None)
        self._lexical.pop(milvus_name(name), None)
        self.flushes.forget(milvus_name(name))
        await self._clock.wrote(CATALOG, await self._run(self._drop, name))

    async def upsert(self, name: str, documents: Sequence[DocumentWrite], now: int) -> None:
        for index, written in enumerate(documents):
            if len(written.text.encode()) > MAX_TEXT_BYTES:
                raise InvalidRequestError(
                    f"documents[{index}].text: the Milvus store holds texts of at most {MAX_TEXT_BYTES} bytes (UTF-8)",
                    param="documents",
                )
        await self._record(name)
        target = milvus_name(name)
        lexical = await self.lexical(name)
        await self._clock.wrote(
            target, await self._run(self._upsert, target, documents, now, lexical, await self._clock.level(target))
        )
        self.flushes.wrote(target, len(documents))

    async def get_documents(self, name: str, ids: Sequence[str]) -> list[Document]:
        await self._record(name)
        target = milvus_name(name)
        rows = await self._run(self._get, target, list(ids), FIELDS, await self._clock.level(target))
        return [document(row) for row in rows]

    async def delete_documents(self, name: str, ids: Sequence[str]) -> int:
        await self._record(name)
        target = milvus_name(name)
        deleted, timestamp = await self._run(self._delete_ids, target, list(ids), await self._clock.level(target))
        await self._clock.wrote(target, timestamp)
        return deleted

    async def delete_matching(self, name: str, where: Filter) -> int:
        await self._record(name)
        target = milvus_name(name)
        deleted, timestamp = await self._run(
            self._delete_filter, target, to_milvus(where), await self._clock.level(target)
        )
        await self._clock.wrote(target, timestamp)
        return deleted

    async def scroll(self, name: str, after: str | None, limit: int) -> tuple[list[Document], str | None]:
        await self._record(name)
        target = milvus_name(name)
        rows = await self._run(self._page, target, after, limit, await self._clock.level(target))
        following = rows[-1]["id"] if len(rows) == limit else None
        return [document(row) for row in rows], following

    async def set_index(self, name: str, updates: dict[str, IndexUpdate]) -> None:
        await self._record(name)
        lexical = await self.lexical(name)
        if not lexical:
            updates = {i: u for i, u in updates.items() if u.vector is not None}  # the terms have nowhere to go
        if not updates:
            return
        target = milvus_name(name)
        await self._clock.wrote(
            target, await self._run(self._set_index, target, updates, lexical, await self._clock.level(target))
        )
        self.flushes.wrote(target, len(updates))

    async def search(
        self, name: str, vector: Vector, top_k: int, where: Filter | None, min_score: float | None
    ) -> list[Hit]:
        await self._record(name)
        params = dense_params(self._index, top_k)
        return await self._hits(name, vector.tolist(), "vector", params, top_k, where, min_score)

    async def lexical_search(
        self, name: str, terms: str, top_k: int, where: Filter | None, min_score: float | None
    ) -> list[Hit]:
        """Milvus's BM25 over the documents' terms: it splits `terms` with the same whitespace tokenizer."""
        await self._record(name)
        if not await self.lexical(name):
            raise LexicalSearchUnavailableError(self.name)
        return await self._hits(name, terms, SPARSE, {"metric_type": "BM25"}, top_k, where, min_score)

    async def ready(self) -> bool:
        try:
            await self._run(self._ping)
        except SearchStoreUnavailableError:
            return False
        return True

    async def aclose(self) -> None:
        await self.flushes.aclose()
        await self._clock.aclose()
        if self._client is not None:
            await self._run(self._client.close)
        self._threads.shutdown()

    async def _record(self, name: str, *, fresh: bool = False) -> Collection:
        cached = self._records.get(name)
        if cached is not None and not fresh and cached[1] > time.monotonic():
            return cached[0]
        rows = await self._run(self._catalog_rows, f"name == {literal(name)}", await self._clock.level(CATALOG))
        if not rows:
            self._records.pop(name, None)
            raise CollectionNotFoundError(name)
        collection = Collection.from_record(rows[0])
        self._records[name] = (collection, time.monotonic() + CATALOG_TTL_SECONDS)
        return collection

    async def _counted(self, target: str, collection: Collection) -> int:
        """Its documents: a chunked collection's are its first chunks."""
        expression = to_milvus(chunks.FIRST) if collection.chunking is not None else ""
        return await self._run(self._count, target, expression, await self._clock.level(target))

    async def _hits(
        self,
        name: str,
        query: list[float] | str,
        field: str,
        params: dict[str, Any],
        top_k: int,
        where: Filter | None,
        min_score: float | None,
    ) -> list[Hit]:
        target = milvus_name(name)
        expression = to_milvus(where) if where is not None else ""
        level = await self._clock.level(target)
        rows = await self._run(self._search, target, query, field, params, top_k, expression, level)
        hits = [hit(row) for row in rows]
        return [h for h in hits if min_score is None or h.score >= min_score]

    async def _flush(self, target: str) -> None:
        await self._run(self._seal, target)

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        return await self._threads.run(call, *args)

    # -- in the thread pool ------------------------------------------------------------------------------

    def _connected(self) -> MilvusClient:
        if self._client is None:
            token = self._token.get_secret_value() if self._token is not None else ""
            client = MilvusClient(uri=self._uri, token=token, timeout=self._timeout)
            if not client.has_collection(CATALOG, timeout=self._timeout):
                client.create_collection(
                    CATALOG,
                    schema=catalog_schema(),
                    index_params=vector_index(client, self._index),
                    consistency_level="Strong",
                    timeout=self._timeout,
                )
            self._full_text = full_text_search(client, self._timeout)
            self._client = client
        return self._client

    def _has_full_text(self) -> bool:
        self._connected()
        return self._full_text

    def _has_terms(self, target: str) -> bool:
        fields = self._connected().describe_collection(target, timeout=self._timeout)["fields"]
        return any(field["name"] == SPARSE for field in fields)

    def _ping(self) -> None:
        self._connected().has_collection(CATALOG, timeout=self._timeout)

    def _mutations(self) -> Any:
        """pymilvus' connection handler: its upsert and delete answer the mutation's timestamp (a guarantee for
        later reads), which MilvusClient's drop."""
        return self._connected()._get_connection()

    def _catalog_rows(self, expression: str, level: ReadLevel) -> list[dict[str, Any]]:
        rows = self._connected().query(
            CATALOG,
            filter=expression or 'name != ""',
            output_fields=["record"],
            timeout=self._timeout,
            **level.options(),
        )
        return [json.loads(row["record"]) for row in rows]

    def _create(self, collection: Collection) -> int:
        client = self._connected()
        if self._catalog_rows(f"name == {literal(collection.name)}", STRONG):
            raise CollectionExistsError(collection.name)
        target = milvus_name(collection.name)
        if client.has_collection(target, timeout=self._timeout):  # a create or delete cut short
            client.drop_collection(target, timeout=self._timeout)
        lexical = self._full_text
        client.create_collection(
            target,
            schema=documents_schema(collection.dimensions, lexical),
            index_params=vector_index(client, self._index, lexical=lexical),
            consistency_level="Strong",  # for other clients: every read of this store states its own
            timeout=self._timeout,
        )
        self._lexical[target] = lexical
        return self._write_record(collection)

    def _write_record(self, collection: Collection) -> int:
        row = {"name": collection.name, "record": json.dumps(collection.record()), "vector": [0.0, 1.0]}
        return int(self._mutations().upsert_rows(CATALOG, [row], timeout=self._timeout).timestamp)

    def _drop(self, name: str) -> int:
        removed = self._delete(CATALOG, f"name == {literal(name)}")
        self._connected().drop_collection(milvus_name(name), timeout=self._timeout)  # gone for clients already
        return removed

    def _count(self, target: str, expression: str, level: ReadLevel) -> int:
        rows = self._connected().query(
            target, filter=expression, output_fields=["count(*)"], timeout=self._timeout, **level.options()
        )
        return int(rows[0]["count(*)"]) if rows else 0

    def _get(self, target: str, ids: list[str], fields: list[str], level: ReadLevel) -> list[dict[str, Any]]:
        if not ids:
            return []
        rows = self._connected().query(
            target, filter=ids_expression(ids), output_fields=fields, timeout=self._timeout, **level.options()
        )
        return list(rows)

    def _upsert(
        self, target: str, documents: Sequence[DocumentWrite], now: int, lexical: bool, level: ReadLevel
    ) -> int:
        existing = self._get(target, [d.id for d in documents], ["id", "created_at"], level)
        created = {row["id"]: row["created_at"] for row in existing}
        rows = [
            {
                "id": d.id,
                "vector": d.vector.tolist(),
                "text": d.text,
                "metadata": d.metadata,
                "created_at": created.get(d.id, now),
                "updated_at": now,
                **({TERMS: bounded_terms(d.terms)} if lexical else {}),
            }
            for d in documents
        ]
        return int(self._mutations().upsert_rows(target, rows, timeout=self._timeout).timestamp)

    def _page(self, target: str, after: str | None, limit: int, level: ReadLevel) -> list[dict[str, Any]]:
        """The `limit` smallest ids after `after` with their rows: Milvus answers a query in no stated order, so
        the ids past the cursor are read (ids only) and sorted here."""
        expression = f"id > {literal(after)}" if after is not None else 'id != ""'
        iterator = self._connected().query_iterator(
            target, batch_size=1000, filter=expression, output_fields=["id"], timeout=self._timeout, **level.options()
        )
        ids: list[str] = []
        try:
            while batch := iterator.next():
                ids = sorted(ids + [row["id"] for row in batch])[:limit]
        finally:
            iterator.close()
        rows = self._get(target, ids, FIELDS, level)
        return sorted(rows, key=lambda row: str(row["id"]))

    def _set_index(self, target: str, updates: dict[str, IndexUpdate], lexical: bool, level: ReadLevel) -> int:
        """Each row written again whole (Milvus upserts rows), its vector and terms replaced."""
        rows = self._get(target, list(updates), [*FIELDS, "vector"], level)
        for row in rows:
            update = updates[row["id"]]
            if update.vector is not None:
                row["vector"] = update.vector.tolist()
            if lexical:
                row[TERMS] = bounded_terms(update.terms)
        return int(self._mutations().upsert_rows(target, rows, timeout=self._timeout).timestamp) if rows else 0

    def _delete_ids(self, target: str, ids: list[str], level: ReadLevel) -> tuple[int, int]:
        found = [row["id"] for row in self._get(target, ids, ["id"], level)]
        return len(found), self._delete(target, ids_expression(found)) if found else 0

    def _delete_filter(self, target: str, expression: str, level: ReadLevel) -> tuple[int, int]:
        count = self._count(target, expression, level)
        return count, self._delete(target, expression) if count else 0

    def _delete(self, target: str, expression: str) -> int:
        """The delete's timestamp; Milvus 2.3 answers 0 there, so then a timestamp allocated after the delete
        returned (Milvus's timestamps only grow): a guarantee that holds it too."""
        handler = self._mutations()
        timestamp = handler.delete(target, expression, timeout=self._timeout).timestamp
        return int(timestamp or handler.alloc_timestamp(timeout=self._timeout))

    def _seal(self, target: str) -> None:
        """Flush: seal the growing segments, so Milvus builds their index (see `milvus_flush.py`)."""
        self._connected().flush(target, timeout=self._timeout)

    def _search(
        self,
        target: str,
        query: list[float] | str,
        field: str,
        params: dict[str, Any],
        top_k: int,
        expression: str,
        level: ReadLevel,
    ) -> list[dict[str, Any]]:
        results = self._connected().search(
            target,
            data=[query],
            limit=top_k,
            filter=expression,
            output_fields=FIELDS,
            anns_field=field,
            search_params=params,
            timeout=self._timeout,
            **level.options(),
        )
        return list(results[0]) if results else []


def full_text_search(client: MilvusClient, timeout: float) -> bool:
    """Whether the server has the BM25 function (Milvus 2.5 and later). Milvus Lite does not say its version;
    its releases that speak this client's protocol are built from 2.5 and later."""
    try:
        version = client.get_server_version(timeout=timeout)
    except Exception:  # Milvus Lite answers gRPC's UNIMPLEMENTED, which pymilvus passes on raw
        return True
    found = re.match(r"v?(\d+)\.(\d+)", version)
    return found is None or (int(found[1]), int(found[2])) >= FULL_TEXT_SEARCH
