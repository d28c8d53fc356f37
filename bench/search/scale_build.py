"""The scale step's collections, built once and kept: a 1,000,000-document build takes most of an hour on 2 cores.

Under `.run/bench-search-scale/<key>/`, `key` a hash of everything the stored documents depend on (the corpus,
the model's export, the top-up's draws and texts, the analyzer, the engine's version and index settings):

    real/          a store folder holding the real documents, ingested once through the API
    <size>/        a copy of it topped up to `size` documents the way the 100,000-document top-up is
                   (`fill.write_top_up`: the gateway's own EmbeddedStore, HNSW built in its child process),
                   with the varied texts of `scale_texts.py`; `built.json` says it is complete, and what it took

A folder without its `built.json` is a build cut short and is built again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from bench.memory import PeakMemory, directory_bytes
from bench.paths import ROOT
from bench.search import scale_texts
from bench.search.fill import WRITE_BATCH, filler, write_top_up
from bench.search.plan import COLLECTION, FILLER_COSINE, Plan
from bench.search.quality import Vectors, unit
from bench.stack import REPOSITORY
from gateway.search.analyzer import ANALYZER
from gateway.search.embedded_files import HNSW
from gateway.search.embedded_points import HNSW_EF_FILTERED
from gateway.search.shard_index import MIN_UNINDEXED_POINTS, live_folder
from gateway.settings import SearchSettings

CACHE = ROOT / ".run" / "bench-search-scale"
BUILT = "built.json"
REAL = "real"


@dataclass(frozen=True)
class Built:
    """A topped-up store folder (the gateway's SEARCH_PATH) and what its build took."""

    path: Path
    documents: int
    write_s: float  # the top-up's upserts through the EmbeddedStore
    index_s: float  # then, until the HNSW index was built and swapped in
    peak_rss_bytes: int  # of the building process and its children (the index build's child included)
    peak_child_rss_bytes: int  # of the index build's child alone: what a gateway needs beside its own to re-index
    disk_bytes: int
    segments: int
    parts_bytes: dict[str, int] = field(default_factory=dict)  # on disk, by part (`footprint`)
    reused: bool = False


def cache_folder(plan: Plan, root: Path = CACHE) -> Path:
    """The folder of this plan's collections: a new one whenever anything the documents depend on changes."""
    corpus = plan.corpus
    parity = REPOSITORY / "bge_onnx" / "1" / "parity.json"
    described = {
        "documents": hashlib.sha256("\n".join(corpus.documents).encode()).hexdigest(),
        "languages": hashlib.sha256("".join(corpus.languages).encode()).hexdigest(),
        "model": hashlib.sha256(parity.read_bytes()).hexdigest() if parity.is_file() else "",
        "filler": [FILLER_COSINE, 7],
        "texts": [getattr(scale_texts, name) for name in ("DROP", "REPLACE", "REPEAT", "INSERTED", "SWAPS", "SEED")],
        "analyzer": ANALYZER,
        "engine": metadata.version("qdrant-edge-py"),
        "index": [repr(HNSW), MIN_UNINDEXED_POINTS],
    }
    key = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]
    return root / key


def cached(folder: Path) -> Built | None:
    record = folder / BUILT
    if not record.is_file():
        return None
    saved: dict[str, Any] = json.loads(record.read_text())
    return Built(**{**saved, "path": folder, "reused": True, "parts_bytes": footprint(folder)})


def real_ready(folder: Path) -> bool:
    return (folder / BUILT).is_file()


def mark_real(folder: Path, documents: int) -> None:
    (folder / BUILT).write_text(json.dumps({"documents": documents}))


async def top_up(base: Path, folder: Path, plan: Plan, size: int, real: Vectors) -> Built:
    """A copy of the real documents' store `base` topped up to `size` documents in `folder` (replaced)."""
    shutil.rmtree(folder, ignore_errors=True)
    building = folder.with_name(f"{folder.name}-building")
    shutil.rmtree(building, ignore_errors=True)
    shutil.copytree(base, building)
    (building / BUILT).unlink(missing_ok=True)
    sized = replace(plan, total_documents=size)
    texts = scale_texts.VariedTexts(plan.corpus.documents, plan.corpus.languages)
    added = filler(sized, real, texts=texts)
    with PeakMemory() as peak:
        await write_top_up(building, sized, added)
    built = Built(building, size, added.write_s, added.index_s, peak.bytes, peak.children_bytes,
                  directory_bytes(building), segments(building), footprint(building))  # fmt: skip
    record = {key: value for key, value in asdict(built).items() if key not in ("path", "reused")}
    (building / BUILT).write_text(json.dumps(record, indent=2))
    building.rename(folder)
    return replace(built, path=folder)


# What each part of a Qdrant Edge shard folder holds, by the name of the folder or file under a segment.
PARTS = {
    "vector_storage": "vectors",
    "vector_index": "HNSW graph",
    "payload_storage": "payload (id, text, metadata, terms)",
    "payload_index": "payload indexes (full-text BM25 on the terms, bucket, lang)",
    "id_tracker": "id mappings",
    "wal": "write-ahead log",
}


def footprint(search_path: Path) -> dict[str, int]:
    """Bytes on disk of the live shard, by part (`PARTS`; the rest under "other")."""
    shard = live_folder(search_path / "collections" / COLLECTION)
    sizes: dict[str, int] = {}
    for path in shard.rglob("*"):
        if path.is_file():
            names = path.relative_to(shard).parts
            part = next((label for key, label in PARTS.items() if any(n.startswith(key) for n in names)), "other")
            sizes[part] = sizes.get(part, 0) + path.stat().st_blocks * 512
    return sizes


def segments(search_path: Path) -> int:
    from qdrant_edge import EdgeShard

    shard = EdgeShard.load(str(live_folder(search_path / "collections" / COLLECTION)))
    try:
        return int(shard.info().segments_count)
    finally:
        shard.close()


@dataclass
class Stored:
    """What a stopped gateway's store holds, in document order (the real ones, then the top-up)."""

    vectors: Vectors
    terms: list[str]
    buckets: np.ndarray[Any, np.dtype[np.int64]]


def stored_documents(search_path: Path, ids: Sequence[str]) -> Stored:
    """The vectors, the analyzed terms and the bucket the store holds for `ids`, read from its shard (the gateway
    must be stopped: an open shard locks its folder): the exact references must use what the engine searched.
    Filled chunk by chunk: a million vectors as Python floats would take gigabytes."""
    from qdrant_edge import EdgeShard

    from gateway.search.embedded_points import TERMS, point_id

    shard = EdgeShard.load(str(live_folder(search_path / "collections" / COLLECTION)))
    chunks: list[Vectors] = []
    terms: list[str] = []
    buckets = np.empty(len(ids), dtype=np.int64)
    try:
        for at in range(0, len(ids), WRITE_BATCH):
            chunk = [point_id(i) for i in ids[at : at + WRITE_BATCH]]
            records = {str(r.id): r for r in shard.retrieve(list(chunk), [TERMS, "metadata"], True)}
            found = [records[key] for key in chunk]
            payloads = [record.payload or {} for record in found]
            chunks.append(unit(np.asarray([record.vector for record in found], dtype=np.float32)))
            terms += [payload[TERMS] for payload in payloads]
            buckets[at : at + len(chunk)] = [payload["metadata"]["bucket"] for payload in payloads]
    finally:
        shard.close()
    return Stored(np.concatenate(chunks), terms, buckets)


def search_settings() -> str:
    """What the gateways search with: SEARCH_HNSW_EF from this environment, which they inherit."""
    hnsw_ef = SearchSettings().hnsw_ef
    filtered = max(hnsw_ef, HNSW_EF_FILTERED)
    return f"hnsw_ef {hnsw_ef} ({filtered} with a filter), HNSW m {HNSW.m}, ef_construct {HNSW.ef_construct}"
