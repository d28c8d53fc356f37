"""The embedded vector store: Qdrant Edge (the Qdrant engine as a library) in this process, on local disk.

Each collection is one shard (`embedded_files.py` has the folders, `embedded_points.py` the documents as points).
The engine is synchronous: its calls run in the store's threads. qdrant-edge-py holds the GIL for much of a
query, so a search on a worker thread still slows the loop, but on the loop's own thread it would stop every other
request for its whole length (an exact scan of an unindexed tail takes milliseconds). Writes to a collection take
its write lock; reads take none. New documents are searchable at once (an exact scan of the unindexed ones); once
enough are unindexed, the HNSW index is built on a copy in a child process and swapped in (`shard_index.py` says
why and how) while searches go on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from qdrant_edge import CountRequest, EdgeOptimizersConfig, EdgeShard, ScrollRequest, UpdateOperation

from gateway.search import chunks
from gateway.search import embedded_points as points
from gateway.search.documents import Collection, Document, Hit, Vector
from gateway.search.embedded_files import create_files, delete_files, open_shard, read_catalog, write_record
from gateway.search.filters import Filter
from gateway.search.qdrant_filter import to_qdrant
from gateway.search.shard_index import (
    MIN_UNINDEXED_POINTS,
    ShardReaders,
    build_index,
    copy_for_indexing,
    discard,
    load_indexed,
    needs_index,
    retire,
)
from gateway.search.store import (
    HNSW_EF,
    CollectionExistsError,
    CollectionNotFoundError,
    DocumentWrite,
    IndexUpdate,
    SearchStoreUnavailableError,
)
from gateway.search.threads import StoreThreads

log = logging.getLogger(__name__)
T = TypeVar("T")


class EmbeddedStore:
    name = "embedded"

    def __init__(
        self,
        path: str | Path,
        *,
        max_threads: int = 4,
        index_after_points: int = MIN_UNINDEXED_POINTS,
        indexing_threshold_kb: int | None = None,
        hnsw_ef: int = HNSW_EF,
    ) -> None:
        """`index_after_points` unindexed points start an index build; `indexing_threshold_kb` is Qdrant's
        segment size from which it builds an HNSW graph (None: Qdrant's default). Tests make both small."""
        self._root = Path(path) / "collections"
        self._index_after = index_after_points
        self._hnsw_ef = hnsw_ef
        self._optimizers = EdgeOptimizersConfig(indexing_threshold=indexing_threshold_kb)
        self._threads = StoreThreads(self.name, max_threads)
        self._collections: dict[str, Collection] | None = None
        self._shards: dict[str, EdgeShard] = {}
        self._lifecycle = asyncio.Lock()  # create, delete and first open of a collection
        self._writes: dict[str, asyncio.Lock] = {}
        self._readers = ShardReaders()
        self._indexing: dict[str, asyncio.Task[None]] = {}
        self._kept: dict[str, list[UpdateOperation]] = {}  # writes made while a copy is being indexed

    async def create_collection(self, collection: Collection) -> None:
        async with self._lifecycle:
            collections = await self._catalog()
            if collection.name in collections:
                raise CollectionExistsError(collection.name)
            shard = await self._run(create_files, self._root, collection, self._optimizers)
            collections[collection.name] = collection
            self._shards[collection.name] = shard

    async def collection(self, name: str) -> Collection:
        collection = (await self._catalog()).get(name)
        if collection is None:
            raise CollectionNotFoundError(name)
        return collection

    async def get_collection(self, name: str) -> Collection:
        collection = await self.collection(name)
        # a chunked collection's documents are its first chunks
        first_chunks = to_qdrant(chunks.FIRST) if collection.chunking is not None else None
        async with self._reading(name) as shard:
            return collection.counted(await self._run(shard.count, CountRequest(exact=True, filter=first_chunks)))

    async def list_collections(self) -> list[Collection]:
        names = sorted(await self._catalog())
        return [await self.get_collection(name) for name in names]

    async def update_collection(self, collection: Collection) -> None:
        async with self._lifecycle:
            collections = await self._catalog()
            if collection.name not in collections:
                raise CollectionNotFoundError(collection.name)
            await self._run(write_record, self._root, collection)
            collections[collection.name] = collection.counted(0)

    async def delete_collection(self, name: str) -> None:
        async with self._lifecycle:
            collections = await self._catalog()
            if name not in collections:
                raise CollectionNotFoundError(name)
            task = self._indexing.pop(name, None)
            if task is not None:
                task.cancel()  # kills the child building the index
                await asyncio.gather(task, return_exceptions=True)
            async with self._write_lock(name):
                del collections[name]  # no new read finds the shard from here on
                shard = self._shards.pop(name, None)
                if shard is not None:
                    await self._readers.finished(shard)
                await self._run(delete_files, self._root, name, shard)

    async def upsert(self, name: str, documents: Sequence[DocumentWrite], now: int) -> None:
        async with self._writing(name) as shard:
            await self._run(points.upsert, shard, documents, now, self._kept.get(name))
        self._index_later(name)

    async def get_documents(self, name: str, ids: Sequence[str]) -> list[Document]:
        async with self._reading(name) as shard:
            records = await self._run(shard.retrieve, [points.point_id(i) for i in ids], points.DOCUMENT_FIELDS, False)
        return [points.document(record.payload) for record in records if record.payload]

    async def delete_documents(self, name: str, ids: Sequence[str]) -> int:
        async with self._writing(name) as shard:
            return await self._run(points.delete_ids, shard, [points.point_id(i) for i in ids], self._kept.get(name))

    async def delete_matching(self, name: str, where: Filter) -> int:
        async with self._writing(name) as shard:
            return await self._run(points.delete_filter, shard, where, self._kept.get(name))

    async def scroll(self, name: str, after: str | None, limit: int) -> tuple[list[Document], str | None]:
        request = ScrollRequest(offset=after, limit=limit, with_payload=points.DOCUMENT_FIELDS, with_vector=False)
        async with self._reading(name) as shard:
            records, following = await self._run(shard.scroll, request)
        documents = [points.document(r.payload) for r in records if r.payload]
        return documents, None if following is None else str(following)

    async def set_index(self, name: str, updates: dict[str, IndexUpdate]) -> None:
        async with self._writing(name) as shard:
            await self._run(points.set_index, shard, updates, self._kept.get(name))
        self._index_later(name)

    async def search(
        self, name: str, vector: Vector, top_k: int, where: Filter | None, min_score: float | None
    ) -> list[Hit]:
        request = points.search_request(vector, top_k, where, min_score, self._hnsw_ef)
        async with self._reading(name) as shard:
            return await self._run(points.query, shard, request)

    async def lexical(self, name: str | None = None) -> bool:
        return True  # Qdrant Edge's full-text index with BM25 scoring, on every collection

    async def lexical_search(
        self, name: str, terms: str, top_k: int, where: Filter | None, min_score: float | None
    ) -> list[Hit]:
        request = points.lexical_request(terms, top_k, where, min_score)
        async with self._reading(name) as shard:
            return await self._run(points.query, shard, request)

    async def ready(self) -> bool:
        try:
            await self._catalog()
        except SearchStoreUnavailableError:
            return False
        return True

    async def wait_indexed(self) -> None:
        """Until the index builds under way have finished (for the benchmark and the tests)."""
        await asyncio.gather(*self._indexing.values(), return_exceptions=True)

    async def aclose(self) -> None:
        for task in self._indexing.values():
            task.cancel()
        await asyncio.gather(*self._indexing.values(), return_exceptions=True)
        for shard in self._shards.values():
            await self._run(shard.close)
        self._shards.clear()
        self._threads.shutdown()

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        return await self._threads.run(call, *args)

    async def _catalog(self) -> dict[str, Collection]:
        if self._collections is None:
            self._collections = await self._run(read_catalog, self._root)
        return self._collections

    async def _shard(self, name: str) -> EdgeShard:
        shard = self._shards.get(name)
        if shard is not None:
            return shard
        async with self._lifecycle:
            collection = (await self._catalog()).get(name)
            if collection is None:
                raise CollectionNotFoundError(name)
            if name not in self._shards:
                self._shards[name] = await self._run(open_shard, self._root, collection)
                self._index_later(name)  # writes of the last run may be unindexed
            return self._shards[name]

    @asynccontextmanager
    async def _writing(self, name: str) -> AsyncIterator[EdgeShard]:
        """The collection's shard under its write lock (fetched inside it: an index swap may have replaced it)."""
        await self._shard(name)
        async with self._write_lock(name):
            shard = self._shards.get(name)
            if shard is None:
                raise CollectionNotFoundError(name)
            yield shard

    @asynccontextmanager
    async def _reading(self, name: str) -> AsyncIterator[EdgeShard]:
        """The collection's shard as it is now, kept open (not closed by a swap or a delete) while the caller
        reads it."""
        async with self._readers.reading(await self._shard(name)) as shard:
            yield shard

    def _write_lock(self, name: str) -> asyncio.Lock:
        return self._writes.setdefault(name, asyncio.Lock())

    def _index_later(self, name: str) -> None:
        running = self._indexing.get(name)
        if running is None or running.done():
            self._indexing[name] = asyncio.create_task(self._index(name))

    async def _index(self, name: str) -> None:
        """Build and swap in indexes until few enough points are unindexed (writes go on meanwhile)."""
        while await self._index_once(name):
            pass

    async def _index_once(self, name: str) -> bool:
        """One build and swap; False when none was needed or it failed."""
        try:
            async with self._write_lock(name):
                shard = self._shards.get(name)
                if shard is None or not await self._run(needs_index, shard, self._index_after):
                    return False
                copy = await self._run(copy_for_indexing, self._root / name, shard)
                self._kept[name] = []
            built = await build_index(copy)
            async with self._write_lock(name):
                writes = self._kept.pop(name, [])
                live = self._shards.get(name)
                if live is None:
                    return False  # deleted meanwhile
                if not built:
                    await self._run(discard, copy)
                    return False
                indexed, replaced = await self._run(load_indexed, copy, writes)
                self._shards[name] = indexed  # new reads use it from here on; those under way finish on `live`
                await self._readers.finished(live)
                await self._run(retire, live, replaced)
                return True
        except SearchStoreUnavailableError as exc:
            log.warning("indexing collection %s failed: %s", name, exc)
            return False
        finally:
            self._kept.pop(name, None)
