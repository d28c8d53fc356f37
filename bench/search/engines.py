"""The embedded vector engines measured side by side, each behind the same three calls: load, search, close.

Each engine is given the same unit vectors and the same `bucket` (integer) metadata, builds its own ANN and
scalar indexes, and answers a top-k cosine search with or without the filter `bucket == value`.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from gateway.search.analyzer import analyze

Vectors = npt.NDArray[np.float32]


class Engine(Protocol):
    name: str

    def load(self, vectors: Vectors, buckets: list[int]) -> None: ...

    def search(self, query: Vectors, top_k: int, bucket: int | None) -> list[int]: ...

    def close(self) -> None: ...


class LanceEngine:
    """LanceDB: IVF_HNSW_SQ on the vectors, a BTREE on the bucket, `refine_factor` re-ranks on the full vectors."""

    name = "lancedb 0.40 (IVF_HNSW_SQ, refine)"

    def __init__(self, folder: Path, nprobes: int = 20, refine_factor: int = 5, ef: int = 128) -> None:
        import lancedb

        shutil.rmtree(folder, ignore_errors=True)
        self._db = lancedb.connect(str(folder))
        self._nprobes, self._refine, self._ef = nprobes, refine_factor, ef
        self._table: Any = None

    def load(self, vectors: Vectors, buckets: list[int]) -> None:
        import pyarrow as pa

        data = pa.table(
            {
                "row": pa.array(range(len(vectors)), pa.int64()),
                "bucket": pa.array(buckets, pa.int64()),
                "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1]),
            }
        )
        self._table = self._db.create_table("bench", data=data)
        self._table.create_index(metric="cosine", index_type="IVF_HNSW_SQ")
        self._table.create_scalar_index("bucket")

    def search(self, query: Vectors, top_k: int, bucket: int | None) -> list[int]:
        builder = self._table.search(query).metric("cosine").limit(top_k).select(["row", "_distance"])
        # lance wants ef >= the rows it refines (top_k x refine_factor)
        builder = builder.nprobes(self._nprobes).refine_factor(self._refine).ef(max(self._ef, top_k * self._refine))
        if bucket is not None:
            builder = builder.where(f"bucket = {int(bucket)}", prefilter=True)
        return [int(row) for row in builder.to_arrow().column("row").to_pylist()]

    def close(self) -> None:
        self._table = None


class QdrantEdgeEngine:
    """Qdrant Edge: HNSW (m 16, ef_construct 100) on the vectors, an integer payload index on the bucket."""

    name = "qdrant-edge 0.9 (HNSW m16)"

    def __init__(self, folder: Path, hnsw_ef: int = 128, *, indexed: bool = True) -> None:
        from qdrant_edge import Distance, EdgeConfig, EdgeShard, EdgeVectorParams, HnswIndexConfig

        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        config = EdgeConfig(
            vectors=EdgeVectorParams(size=384, distance=Distance.Cosine),
            hnsw_config=HnswIndexConfig(m=16, ef_construct=100, full_scan_threshold=10_000),
        )
        self._shard = EdgeShard.create(str(folder), config)
        self._ef = hnsw_ef
        self._indexed = indexed
        if not indexed:
            self.name = "qdrant-edge 0.9 (no index: exact scan)"

    def load(self, vectors: Vectors, buckets: list[int]) -> None:
        from qdrant_edge import PayloadSchemaType, Point, UpdateOperation

        self._shard.update(UpdateOperation.create_field_index("bucket", PayloadSchemaType.Integer))
        for start in range(0, len(vectors), 2_000):
            points = [
                Point(str(uuid.UUID(int=row)), vectors[row].tolist(), {"row": row, "bucket": buckets[row]})
                for row in range(start, min(start + 2_000, len(vectors)))
            ]
            self._shard.update(UpdateOperation.upsert_points(points))
        if self._indexed:
            self._shard.optimize()  # holds the GIL while it builds the HNSW graph (qdrant-edge-py 0.9)

    def search(self, query: Vectors, top_k: int, bucket: int | None) -> list[int]:
        from qdrant_edge import FieldCondition, Filter, MatchValue, Query, QueryRequest, SearchParams

        where = None if bucket is None else Filter(must=[FieldCondition("bucket", match=MatchValue(bucket))])
        request = QueryRequest(
            limit=top_k,
            query=Query.Nearest(query.tolist()),
            filter=where,
            with_payload=True,
            params=SearchParams(hnsw_ef=self._ef),
        )
        return [int(point.payload["row"]) for point in self._shard.query(request) if point.payload]

    def close(self) -> None:
        self._shard.close()


class GatewayEmbeddedEngine:
    """The gateway's own embedded store (`gateway.search.embedded`, Qdrant Edge underneath) used as the gateway
    uses it: 1,000-document upserts (each flushed), the metadata filter compiled from `{"bucket": n}`, texts and
    metadata read back with every hit."""

    name = "gateway EmbeddedStore (qdrant-edge)"

    def __init__(self, folder: Path) -> None:
        import asyncio

        from gateway.search.embedded import EmbeddedStore

        shutil.rmtree(folder, ignore_errors=True)
        self._loop = asyncio.new_event_loop()
        self._store = EmbeddedStore(folder)
        self.ingest_s = self.index_s = self.max_loop_stall_s = 0.0

    def load(self, vectors: Vectors, buckets: list[int]) -> None:
        import time

        from gateway.search.documents import Collection
        from gateway.search.store import DocumentWrite

        run = self._loop.run_until_complete
        run(self._store.create_collection(Collection("bench", "m", "r", vectors.shape[1], 0, None)))
        started = time.perf_counter()
        for start in range(0, len(vectors), 1_000):
            batch = [
                DocumentWrite(
                    str(row), f"document {row}", {"bucket": buckets[row]}, vectors[row], analyze(f"document {row}")
                )
                for row in range(start, min(start + 1_000, len(vectors)))
            ]
            run(self._store.upsert("bench", batch, 0))
        self.ingest_s = time.perf_counter() - started
        run(self._indexed())

    async def _indexed(self) -> None:
        """Wait for the index build (in its child process), measuring how late the event loop wakes meanwhile."""
        import asyncio
        import time

        async def watch() -> None:
            while True:
                before = time.perf_counter()
                await asyncio.sleep(0.01)
                self.max_loop_stall_s = max(self.max_loop_stall_s, time.perf_counter() - before - 0.01)

        watcher = asyncio.create_task(watch())
        started = time.perf_counter()
        await self._store.wait_indexed()
        self.index_s = time.perf_counter() - started
        watcher.cancel()

    def search(self, query: Vectors, top_k: int, bucket: int | None) -> list[int]:
        from gateway.search.filters import parse_filter

        where = None if bucket is None else parse_filter({"bucket": bucket})
        hits = self._loop.run_until_complete(self._store.search("bench", query, top_k, where, None))
        return [int(hit.id) for hit in hits]

    def close(self) -> None:
        self._loop.run_until_complete(self._store.aclose())
        self._loop.close()
