"""The Milvus vector store: collections in a Milvus server, shared by every replica, through pymilvus.

    gateway_collections        the catalog: one row per collection (its record as JSON)
    gw_<name>                  one Milvus collection per collection: id (primary key), vector (cosine; HNSW, or
                               AUTOINDEX as SEARCH_MILVUS_INDEX says), text, metadata (JSON), created_at,
                               updated_at; on Milvus 2.5 and later also terms and their BM25 (`milvus_rows.py`),
                               what lexical search searches

A document is searchable, from every replica, when its upsert returns: each read states its own consistency,
from the last write's timestamp of its collection (`milvus_clock.py`: no wait on a collection not written to within
the minute, at most a time tick right after a write), so collections keep the Strong level they are created with
for other clients, old ones included. Bulk writes are flushed once they go quiet, so their rows are searched
through the HNSW index (`milvus_flush.py`). The client connects on first use, not at start, so a gateway whose
Milvus is down starts and serves everything else; every call (`milvus_calls.py`) runs on the store's thread pool
with SEARCH_MILVUS_TIMEOUT_SECONDS.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pydantic import SecretStr

from gateway.errors import InvalidRequestError
from gateway.redis_client import RedisConnection
from gateway.search import chunks
from gateway.search.documents import Collection, Document, Hit, Vector
from gateway.search.filters import Filter
from gateway.search.milvus_calls import MilvusCalls
from gateway.search.milvus_clock import WriteClock
from gateway.search.milvus_filter import literal, to_milvus
from gateway.search.milvus_flush import QuietFlush
from gateway.search.milvus_rows import (
    CATALOG,
    FIELDS,
    MAX_TEXT_BYTES,
    SPARSE,
    VectorIndex,
    dense_params,
    document,
    hit,
    milvus_name,
)
from gateway.search.store import (
    HNSW_EF,
    CollectionNotFoundError,
    DocumentWrite,
    IndexUpdate,
    LexicalSearchUnavailableError,
    SearchStoreUnavailableError,
)
from gateway.search.threads import StoreThreads

T = TypeVar("T")
CATALOG_TTL_SECONDS = 5.0  # how long this replica trusts its copy of a collection's record


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
        hnsw_ef: int = HNSW_EF,
    ) -> None:
        self._index = index
        self._hnsw_ef = hnsw_ef
        self._calls = MilvusCalls(uri, token, timeout_seconds, index)
        self._lexical: dict[str, bool] = {}  # by Milvus collection: whether it was made with terms and BM25
        self._threads = StoreThreads(self.name, max_threads)
        self._records: dict[str, tuple[Collection, float]] = {}
        self._clock = WriteClock(redis, uri)
        self.flushes = QuietFlush(self._flush, min_rows=flush_after_rows, quiet_seconds=flush_quiet_seconds)

    async def create_collection(self, collection: Collection) -> None:
        lexical = await self.lexical()
        await self._clock.wrote(CATALOG, await self._run(self._calls.create, collection, lexical))
        self._lexical[milvus_name(collection.name)] = lexical
        self._records[collection.name] = (collection, time.monotonic() + CATALOG_TTL_SECONDS)

    async def collection(self, name: str) -> Collection:
        return await self._record(name)

    async def lexical(self, name: str | None = None) -> bool:
        if name is None:
            return await self._run(self._calls.has_full_text)
        target = milvus_name(name)
        if target not in self._lexical:
            self._lexical[target] = await self._run(self._calls.has_terms, target)
        return self._lexical[target]

    async def get_collection(self, name: str) -> Collection:
        collection = await self._record(name, fresh=True)
        return collection.counted(await self._counted(milvus_name(name), collection))

    async def list_collections(self) -> list[Collection]:
        records = await self._run(self._calls.catalog_rows, "", await self._clock.level(CATALOG))
        counted = []
        for record in records:
            collection = Collection.from_record(record)
            counted.append(collection.counted(await self._counted(milvus_name(collection.name), collection)))
        return sorted(counted, key=lambda c: c.name)

    async def update_collection(self, collection: Collection) -> None:
        await self._record(collection.name, fresh=True)
        await self._clock.wrote(CATALOG, await self._run(self._calls.write_record, collection))
        self._records[collection.name] = (collection, time.monotonic() + CATALOG_TTL_SECONDS)

    async def delete_collection(self, name: str) -> None:
        await self._record(name, fresh=True)
        self._records.pop(name, None)
        self._lexical.pop(milvus_name(name), None)
        self.flushes.forget(milvus_name(name))
        await self._clock.wrote(CATALOG, await self._run(self._calls.drop, name))

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
            target,
            await self._run(self._calls.upsert, target, documents, now, lexical, await self._clock.level(target)),
        )
        self.flushes.wrote(target, len(documents))

    async def get_documents(self, name: str, ids: Sequence[str]) -> list[Document]:
        await self._record(name)
        target = milvus_name(name)
        rows = await self._run(self._calls.get, target, list(ids), FIELDS, await self._clock.level(target))
        return [document(row) for row in rows]

    async def delete_documents(self, name: str, ids: Sequence[str]) -> int:
        await self._record(name)
        target = milvus_name(name)
        deleted, timestamp = await self._run(self._calls.delete_ids, target, list(ids), await self._clock.level(target))
        await self._clock.wrote(target, timestamp)
        return deleted

    async def delete_matching(self, name: str, where: Filter) -> int:
        await self._record(name)
        target = milvus_name(name)
        deleted, timestamp = await self._run(
            self._calls.delete_filter, target, to_milvus(where), await self._clock.level(target)
        )
        await self._clock.wrote(target, timestamp)
        return deleted

    async def scroll(self, name: str, after: str | None, limit: int) -> tuple[list[Document], str | None]:
        await self._record(name)
        target = milvus_name(name)
        rows = await self._run(self._calls.page, target, after, limit, await self._clock.level(target))
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
            target, await self._run(self._calls.set_index, target, updates, lexical, await self._clock.level(target))
        )
        self.flushes.wrote(target, len(updates))

    async def search(
        self, name: str, vector: Vector, top_k: int, where: Filter | None, min_score: float | None
    ) -> list[Hit]:
        await self._record(name)
        params = dense_params(self._index, top_k, self._hnsw_ef)
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
            await self._run(self._calls.ping)
        except SearchStoreUnavailableError:
            return False
        return True

    async def aclose(self) -> None:
        await self.flushes.aclose()
        await self._clock.aclose()
        await self._run(self._calls.close)
        self._threads.shutdown()

    async def _record(self, name: str, *, fresh: bool = False) -> Collection:
        cached = self._records.get(name)
        if cached is not None and not fresh and cached[1] > time.monotonic():
            return cached[0]
        rows = await self._run(self._calls.catalog_rows, f"name == {literal(name)}", await self._clock.level(CATALOG))
        if not rows:
            self._records.pop(name, None)
            raise CollectionNotFoundError(name)
        collection = Collection.from_record(rows[0])
        self._records[name] = (collection, time.monotonic() + CATALOG_TTL_SECONDS)
        return collection

    async def _counted(self, target: str, collection: Collection) -> int:
        """Its documents: a chunked collection's are its first chunks."""
        expression = to_milvus(chunks.FIRST) if collection.chunking is not None else ""
        return await self._run(self._calls.count, target, expression, await self._clock.level(target))

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
        rows = await self._run(self._calls.search, target, query, field, params, top_k, expression, level)
        hits = [hit(row) for row in rows]
        return [h for h in hits if min_score is None or h.score >= min_score]

    async def _flush(self, target: str) -> None:
        await self._run(self._calls.seal, target)

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        return await self._threads.run(call, *args)
