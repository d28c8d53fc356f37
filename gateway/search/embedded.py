"""The embedded vector store: Qdrant Edge (the Qdrant engine as a library) in this process, on local disk.

    SEARCH_PATH/collections/<name>/collection.json   the collection's record (written last on create)
    SEARCH_PATH/collections/<name>/shard/             Qdrant Edge's shard: segments, HNSW index, WAL

A document is one point: its id is a UUID derived from the client's id, its payload holds the client's id, the
text, the metadata and the timestamps, so a search answers in one call. Every write is flushed before the call
returns. Qdrant Edge indexes in-process only when asked: after writes the store runs its optimizer in the
background (one at a time per collection), so new documents are searchable at once (by a scan of the
unindexed segment) and fast once indexed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from qdrant_edge import (
    CountRequest,
    Distance,
    EdgeConfig,
    EdgeShard,
    EdgeVectorParams,
    HnswIndexConfig,
    Point,
    Query,
    QueryRequest,
    SearchParams,
    UpdateOperation,
)

from gateway.search.documents import Collection, Document, Hit, Vector
from gateway.search.filters import Filter
from gateway.search.qdrant_filter import flags, to_qdrant
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
HNSW_EF = 128  # search breadth; the benchmark (docs/benchmarks.md) chose it for recall@10 of exact search


def point_id(document_id: str) -> str:
    return str(uuid.uuid5(ID_NAMESPACE, document_id))


class EmbeddedStore:
    name = "embedded"

    def __init__(self, path: str | Path, *, max_threads: int = 4) -> None:
        self._root = Path(path) / "collections"
        self._threads = StoreThreads(self.name, max_threads)
        self._collections: dict[str, Collection] | None = None
        self._shards: dict[str, EdgeShard] = {}
        self._lifecycle = asyncio.Lock()  # create, delete and first open of a collection
        self._writes: dict[str, asyncio.Lock] = {}
        self._optimizing: dict[str, asyncio.Task[None]] = {}

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
        shard = await self._shard(name)
        return collection.counted(await self._run(shard.count, CountRequest(exact=True)))

    async def list_collections(self) -> list[Collection]:
        names = sorted(await self._catalog())
        return [await self.get_collection(name) for name in names]

    async def delete_collection(self, name: str) -> None:
        async with self._lifecycle:
            collections = await self._catalog()
            if name not in collections:
                raise CollectionNotFoundError(name)
            task = self._optimizing.pop(name, None)
            if task is not None:
                await asyncio.gather(task, return_exceptions=True)
            async with self._write_lock(name):
                del collections[name]
                shard = self._shards.pop(name, None)
                await self._run(self._delete_files, name, shard)

    async def upsert(self, name: str, documents: Sequence[DocumentWrite], now: int) -> None:
        shard = await self._shard(name)
        async with self._write_lock(name):
            await self._run(self._upsert, shard, documents, now)
        self._optimize_later(name, shard)

    async def get_documents(self, name: str, ids: Sequence[str]) -> list[Document]:
        shard = await self._shard(name)
        records = await self._run(shard.retrieve, [point_id(i) for i in ids], True, False)
        return [document(record.payload) for record in records if record.payload]

    async def delete_documents(self, name: str, ids: Sequence[str]) -> int:
        shard = await self._shard(name)
        async with self._write_lock(name):
            return await self._run(self._delete_ids, shard, [point_id(i) for i in ids])

    async def delete_matching(self, name: str, where: Filter) -> int:
        shard = await self._shard(name)
        async with self._write_lock(name):
            return await self._run(self._delete_filter, shard, where)

    async def search(
        self, name: str, vector: Vector, top_k: int, where: Filter | None, min_score: float | None
    ) -> list[Hit]:
        shard = await self._shard(name)
        request = QueryRequest(
            limit=top_k,
            query=Query.Nearest(vector.tolist()),
            filter=to_qdrant(where) if where is not None else None,
            with_payload=True,
            score_threshold=min_score,
            params=SearchParams(hnsw_ef=max(HNSW_EF, top_k)),
        )
        points = await self._run(shard.query, request)
        return [hit(point.score, point.payload) for point in points if point.payload]

    async def ready(self) -> bool:
        try:
            await self._catalog()
        except SearchStoreUnavailableError:
            return False
        return True

    async def aclose(self) -> None:
        await asyncio.gather(*self._optimizing.values(), return_exceptions=True)
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
            vectors=EdgeVectorParams(size=collection.dimensions, distance=Distance.Cosine), hnsw_config=HNSW
        )
        shard = EdgeShard.create(str(folder / "shard"), config)
        write_durably(folder / RECORD, json.dumps(collection.record()).encode())
        return shard

    def _delete_files(self, name: str, shard: EdgeShard | None) -> None:
        if shard is not None:
            shard.close()
        folder = self._root / name
        trash = self._root.parent / f"deleted-{uuid.uuid4().hex}"
        (folder / RECORD).unlink()  # gone for good from here on, even if the removal below is cut short
        folder.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)

    def _upsert(self, shard: EdgeShard, documents: Sequence[DocumentWrite], now: int) -> None:
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
        shard.update(UpdateOperation.upsert_points(points))
        shard.flush()

    def _delete_ids(self, shard: EdgeShard, ids: list[PointId]) -> int:
        found = [record.id for record in shard.retrieve(ids, False, False)]
        if found:
            shard.update(UpdateOperation.delete_points(found))
            shard.flush()
        return len(found)

    def _delete_filter(self, shard: EdgeShard, where: Filter) -> int:
        compiled = to_qdrant(where)
        count = shard.count(CountRequest(exact=True, filter=compiled))
        if count:
            shard.update(UpdateOperation.delete_points_by_filter(compiled))
            shard.flush()
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
                self._shards[name] = await self._run(EdgeShard.load, str(self._root / name / "shard"))
                self._optimize_later(name, self._shards[name])  # writes of the last run may be unindexed
            return self._shards[name]

    def _write_lock(self, name: str) -> asyncio.Lock:
        return self._writes.setdefault(name, asyncio.Lock())

    def _optimize_later(self, name: str, shard: EdgeShard) -> None:
        running = self._optimizing.get(name)
        if running is None or running.done():
            self._optimizing[name] = asyncio.create_task(self._optimize(name, shard))

    async def _optimize(self, name: str, shard: EdgeShard) -> None:
        try:
            while await self._run(shard.optimize):
                pass
        except SearchStoreUnavailableError as exc:
            log.warning("indexing collection %s failed: %s", name, exc)


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
