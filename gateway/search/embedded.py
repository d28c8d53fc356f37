"""The embedded vector store: Qdrant Edge (the Qdrant engine as a library) in this process, on local disk.

    SEARCH_PATH/collections/<name>/collection.json   the collection's record (written last on create)
    SEARCH_PATH/collections/<name>/shard/             Qdrant Edge's shard: segments, HNSW index, WAL

A document is one point: its id is a UUID derived from the client's id, its payload holds the client's id, the
text, the metadata and the timestamps, so a search answers in one call. Every write is flushed before the call
returns. New documents are searchable at once (an exact scan of the unindexed ones); once enough are unindexed,
the HNSW index is built on a copy in a child process and swapped in (`shard_index.py` says why and how).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from qdrant_edge import (
    CountRequest,
    Distance,
    EdgeConfig,
    EdgeOptimizersConfig,
    EdgeShard,
    EdgeVectorParams,
    HnswIndexConfig,
    PayloadSchemaType,
    Point,
    PointVectors,
    Query,
    QueryRequest,
    ScrollRequest,
    SearchParams,
    UpdateOperation,
)

from gateway.search.documents import Collection, Document, Hit, Vector
from gateway.search.filters import Filter
from gateway.search.qdrant_filter import flags, payload_indexes, to_qdrant
from gateway.search.shard_index import (
    LIVE,
    MIN_UNINDEXED_POINTS,
    SwapGate,
    build_index,
    copy_for_indexing,
    discard,
    needs_index,
    recover,
    swap_in,
)
from gateway.search.store import (
    CollectionExistsError,
    CollectionNotFoundError,
    DocumentWrite,
    SearchStoreUnavailableError,
)
from gateway.search.threads import StoreThreads

log = logging.getLogger(__name__)
T = TypeVar("T")
PointId = int | uuid.UUID | str
RECORD = "collection.json"
ID_NAMESPACE = uuid.UUID("6f1c1a52-4d0e-4a8e-9a53-2d3f7f1e0c11")  # fixed: ids must map the same way forever
HNSW = HnswIndexConfig(m=16, ef_construct=100, full_scan_threshold=10_000)
HNSW_EF = 200  # search breadth: docs/benchmarks.md has the recall it buys


def point_id(document_id: str) -> str:
    return str(uuid.uuid5(ID_NAMESPACE, document_id))


class EmbeddedStore:
    name = "embedded"

    def __init__(
        self,
        path: str | Path,
        *,
        max_threads: int = 4,
        index_after_points: int = MIN_UNINDEXED_POINTS,
        indexing_threshold_kb: int | None = None,
    ) -> None:
        """`index_after_points` unindexed points start an index build; `indexing_threshold_kb` is Qdrant's
        segment size from which it builds an HNSW graph (None: Qdrant's default). Tests make both small."""
        self._root = Path(path) / "collections"
        self._index_after = index_after_points
        self._optimizers = EdgeOptimizersConfig(indexing_threshold=indexing_threshold_kb)
        self._threads = StoreThreads(self.name, max_threads)
        self._collections: dict[str, Collection] | None = None
        self._shards: dict[str, EdgeShard] = {}
        self._lifecycle = asyncio.Lock()  # create, delete and first open of a collection
        self._writes: dict[str, asyncio.Lock] = {}
        self._gates: dict[str, SwapGate] = {}
        self._indexing: dict[str, asyncio.Task[None]] = {}
        self._kept: dict[str, list[UpdateOperation]] = {}  # writes made while a copy is being indexed

    async def create_collection(self, collection: Collection) -> None:
        async with self._lifecycle:
            collections = await self._catalog()
            if collection.name in collections:
                raise CollectionExistsError(collection.name)
            shard = await self._run(self._create_files, collection)
            collections[collection.name] = collection
            self._shards[collection.name] = shard

    async def collection(self, name: str) -> Collection:
        collection = (await self._catalog()).get(name)
        if collection is None:
            raise CollectionNotFoundError(name)
        return collection

    async def get_collection(self, name: str) -> Collection:
        collection = await self.collection(name)
        async with self._reading(name) as shard:
            return collection.counted(await self._run(shard.count, CountRequest(exact=True)))

    async def list_collections(self) -> list[Collection]:
        names = sorted(await self._catalog())
        return [await self.get_collection(name) for name in names]

    async def update_collection(self, collection: Collection) -> None:
        async with self._lifecycle:
            collections = await self._catalog()
            if collection.name not in collections:
                raise CollectionNotFoundError(collection.name)
            record = json.dumps(collection.record()).encode()
            await self._run(write_durably, self._root / collection.name / RECORD, record)
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
            async with self._write_lock(name), self._gate(name).closing():
                del collections[name]
                shard = self._shards.pop(name, None)
                await self._run(self._delete_files, name, shard)

    async def upsert(self, name: str, documents: Sequence[DocumentWrite], now: int) -> None:
        async with self._writing(name) as shard:
            await self._run(self._upsert, shard, documents, now, self._kept.get(name))
        self._index_later(name)

    async def get_documents(self, name: str, ids: Sequence[str]) -> list[Document]:
        async with self._reading(name) as shard:
            records = await self._run(shard.retrieve, [point_id(i) for i in ids], True, False)
        return [document(record.payload) for record in records if record.payload]

    async def delete_documents(self, name: str, ids: Sequence[str]) -> int:
        async with self._writing(name) as shard:
            return await self._run(self._delete_ids, shard, [point_id(i) for i in ids], self._kept.get(name))

    async def delete_matching(self, name: str, where: Filter) -> int:
        async with self._writing(name) as shard:
            return await self._run(self._delete_filter, shard, where, self._kept.get(name))

    async def scroll(self, name: str, after: str | None, limit: int) -> tuple[list[Document], str | None]:
        request = ScrollRequest(offset=after, limit=limit, with_payload=True, with_vector=False)
        async with self._reading(name) as shard:
            records, following = await self._run(shard.scroll, request)
        return [document(r.payload) for r in records if r.payload], None if following is None else str(following)

    async def set_vectors(self, name: str, vectors: dict[str, Vector]) -> None:
        operation = UpdateOperation.update_vectors([PointVectors(point_id(i), v.tolist()) for i, v in vectors.items()])
        async with self._writing(name) as shard:
            await self._run(apply, shard, operation, self._kept.get(name))
        self._index_later(name)

    async def search(
        self, name: str, vector: Vector, top_k: int, where: Filter | None, min_score: float | None
    ) -> list[Hit]:
        request = QueryRequest(
            limit=top_k,
            query=Query.Nearest(vector.tolist()),
            filter=to_qdrant(where) if where is not None else None,
            with_payload=True,
            score_threshold=min_score,
            params=SearchParams(hnsw_ef=max(HNSW_EF, top_k)),
        )
        async with self._reading(name) as shard:
            points = await self._run(shard.query, request)
        return [hit(point.score, point.payload) for point in points if point.payload]

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

    # -- in the thread pool ------------------------------------------------------------------------------

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        return await self._threads.run(call, *args)

    def _read_catalog(self) -> dict[str, Collection]:
        self._root.mkdir(parents=True, exist_ok=True)
        collections = {}
        for folder in sorted(self._root.iterdir()):
            record = folder / RECORD
            if record.is_file():
                collections[folder.name] = Collection.from_record(json.loads(record.read_text()))
        return collections

    def _create_files(self, collection: Collection) -> EdgeShard:
        folder = self._root / collection.name
        shutil.rmtree(folder, ignore_errors=True)  # a create that crashed before its record was written
        folder.mkdir(parents=True)
        config = EdgeConfig(
            vectors=EdgeVectorParams(size=collection.dimensions, distance=Distance.Cosine),
            hnsw_config=HNSW,
            optimizers=self._optimizers,
        )
        shard = EdgeShard.create(str(folder / LIVE), config)
        write_durably(folder / RECORD, json.dumps(collection.record()).encode())
        return shard

    def _open(self, name: str) -> EdgeShard:
        folder = self._root / name
        recover(folder)
        return EdgeShard.load(str(folder / LIVE))

    def _delete_files(self, name: str, shard: EdgeShard | None) -> None:
        if shard is not None:
            shard.close()
        folder = self._root / name
        trash = self._root.parent / f"deleted-{uuid.uuid4().hex}"
        (folder / RECORD).unlink()  # gone for good from here on, even if the removal below is cut short
        folder.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)

    def _upsert(
        self, shard: EdgeShard, documents: Sequence[DocumentWrite], now: int, kept: list[UpdateOperation] | None
    ) -> None:
        self._index_fields(shard, documents, kept)
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
                },
            )
            for key, d in zip(ids, documents, strict=True)
        ]
        apply(shard, UpdateOperation.upsert_points(points), kept)

    def _index_fields(
        self, shard: EdgeShard, documents: Sequence[DocumentWrite], kept: list[UpdateOperation] | None
    ) -> None:
        """A payload index for each metadata field as it first appears (a field seen later with another type
        is filtered without one), so that filtered searches stay fast."""
        wanted: dict[str, PayloadSchemaType] = {}
        for document in documents:
            for path, schema in payload_indexes(document.metadata).items():
                wanted.setdefault(path, schema)
        existing = shard.info().payload_schema
        for path, schema in wanted.items():
            if path not in existing:
                apply(shard, UpdateOperation.create_field_index(path, schema), kept)

    def _delete_ids(self, shard: EdgeShard, ids: list[PointId], kept: list[UpdateOperation] | None) -> int:
        found = [record.id for record in shard.retrieve(ids, False, False)]
        if found:
            apply(shard, UpdateOperation.delete_points(found), kept)
        return len(found)

    def _delete_filter(self, shard: EdgeShard, where: Filter, kept: list[UpdateOperation] | None) -> int:
        compiled = to_qdrant(where)
        count = shard.count(CountRequest(exact=True, filter=compiled))
        if count:
            apply(shard, UpdateOperation.delete_points_by_filter(compiled), kept)
        return int(count)

    # -- on the event loop -------------------------------------------------------------------------------

    async def _catalog(self) -> dict[str, Collection]:
        if self._collections is None:
            self._collections = await self._run(self._read_catalog)
        return self._collections

    async def _shard(self, name: str) -> EdgeShard:
        shard = self._shards.get(name)
        if shard is not None:
            return shard
        async with self._lifecycle:
            if name not in await self._catalog():
                raise CollectionNotFoundError(name)
            if name not in self._shards:
                self._shards[name] = await self._run(self._open, name)
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
        """The collection's shard, kept open (no swap or close) while the caller reads it."""
        await self._shard(name)
        async with self._gate(name).reading():
            shard = self._shards.get(name)
            if shard is None:
                raise CollectionNotFoundError(name)
            yield shard

    def _gate(self, name: str) -> SwapGate:
        return self._gates.setdefault(name, SwapGate())

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
        folder = self._root / name
        try:
            async with self._write_lock(name):
                shard = self._shards.get(name)
                if shard is None or not await self._run(needs_index, shard, self._index_after):
                    return False
                await self._run(copy_for_indexing, folder, shard)
                self._kept[name] = []
            built = await build_index(folder)
            async with self._write_lock(name):
                writes = self._kept.pop(name, [])
                shard = self._shards.get(name)
                if shard is None:
                    return False  # deleted meanwhile
                if not built:
                    await self._run(discard, folder)
                    return False
                async with self._gate(name).closing():
                    self._shards[name] = await self._run(swap_in, folder, shard, writes)
                return True
        except SearchStoreUnavailableError as exc:
            log.warning("indexing collection %s failed: %s", name, exc)
            return False
        finally:
            self._kept.pop(name, None)


def apply(shard: EdgeShard, operation: UpdateOperation, kept: list[UpdateOperation] | None) -> None:
    """Apply and flush a write; keep it too while a copy of the shard is being indexed."""
    shard.update(operation)
    shard.flush()
    if kept is not None:
        kept.append(operation)


def document(payload: dict[str, Any]) -> Document:
    return Document(payload["id"], payload["text"], payload["metadata"], payload["created_at"], payload["updated_at"])


def hit(score: float, payload: dict[str, Any]) -> Hit:
    return Hit(payload["id"], float(score), payload["text"], payload["metadata"])


def write_durably(path: Path, content: bytes) -> None:
    """Write `content` to `path` so that a crash leaves the old file or the new one, never half of it."""
    temporary = path.with_suffix(".tmp")
    with temporary.open("wb") as file:
        file.write(content)
        file.flush()
        os.fsync(file.fileno())
    temporary.replace(path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
