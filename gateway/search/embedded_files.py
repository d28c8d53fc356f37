"""The embedded store's folders (synchronous, run in the store's threads):

SEARCH_PATH/collections/<name>/collection.json   the collection's record (written last on create)
SEARCH_PATH/collections/<name>/shard*/            Qdrant Edge's shard: segments, HNSW index, WAL
                                                  (which of them is live: `shard_index.py`)
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

from qdrant_edge import Distance, EdgeConfig, EdgeOptimizersConfig, EdgeShard, EdgeVectorParams, HnswIndexConfig

from gateway.search.documents import Collection
from gateway.search.durable import write_durably
from gateway.search.embedded_points import index_terms
from gateway.search.shard_index import LIVE, live_folder, recover

RECORD = "collection.json"
HNSW = HnswIndexConfig(m=16, ef_construct=100, full_scan_threshold=10_000)
# Qdrant searches a shard's segments in parallel on a pool of its own (by default a thread per CPU). Here the
# concurrency comes from the requests, and an indexed shard is one large segment and a small one, so the pool only
# adds CPU to each search (docs/benchmarks.md has how much).
SEARCH_THREADS = 1


def read_catalog(root: Path) -> dict[str, Collection]:
    root.mkdir(parents=True, exist_ok=True)
    collections = {}
    for folder in sorted(root.iterdir()):
        record = folder / RECORD
        if record.is_file():
            collections[folder.name] = Collection.from_record(json.loads(record.read_text()))
    return collections


def write_record(root: Path, collection: Collection) -> None:
    write_durably(root / collection.name / RECORD, json.dumps(collection.record()).encode())


def create_files(root: Path, collection: Collection, optimizers: EdgeOptimizersConfig) -> EdgeShard:
    folder = root / collection.name
    shutil.rmtree(folder, ignore_errors=True)  # a create that crashed before its record was written
    folder.mkdir(parents=True)
    config = EdgeConfig(
        vectors=vector_params(collection),
        hnsw_config=HNSW,
        optimizers=optimizers,
        max_search_threads=SEARCH_THREADS,
    )
    shard = EdgeShard.create(str(folder / LIVE), config)
    index_terms(shard, None)
    write_record(root, collection)
    return shard


def open_shard(root: Path, collection: Collection) -> EdgeShard:
    """The collection's live shard, searching with `SEARCH_THREADS` even if it was created before that setting
    (the rest of its configuration is kept as it was written; copies made for indexing inherit it)."""
    folder = root / collection.name
    recover(folder)
    config = EdgeConfig(vectors=vector_params(collection), max_search_threads=SEARCH_THREADS)
    return EdgeShard.load(str(live_folder(folder)), config)


def vector_params(collection: Collection) -> EdgeVectorParams:
    return EdgeVectorParams(size=collection.dimensions, distance=Distance.Cosine)


def delete_files(root: Path, name: str, shard: EdgeShard | None) -> None:
    if shard is not None:
        shard.close()
    folder = root / name
    trash = root.parent / f"deleted-{uuid.uuid4().hex}"
    (folder / RECORD).unlink()  # gone for good from here on, even if the removal below is cut short
    folder.rename(trash)
    shutil.rmtree(trash, ignore_errors=True)
