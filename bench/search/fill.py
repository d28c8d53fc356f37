"""The top-up to the measured collection's size: vectors drawn around the real documents' vectors, written
straight into the stopped gateway's store folder through the gateway's own `EmbeddedStore`.

Embedding 100,000 texts through the served model takes most of an hour on 2 cores, and the latency of a search
does not depend on where a stored vector came from, only on how the vectors lie. So the collection holds the
real documents (embedded through the API) and, up to the total, copies of them moved by Gaussian noise to a
cosine of about 0.8 with their source: the real data's clusters (two languages, topics), none equal to another.
Each top-up document carries its source's text and language, so hits serialise as much as real ones.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.search.plan import COLLECTION, FILLER_COSINE, Plan
from bench.search.quality import Vectors, unit
from gateway.search.analyzer import analyze

WRITE_BATCH = 1_000  # documents a store call, the API's maximum per upsert
NOISE_CHUNK = 100_000  # top-up vectors drawn at once


@dataclass
class TopUp:
    vectors: Vectors
    texts: list[str]
    write_s: float = 0.0
    index_s: float = 0.0


def filler(plan: Plan, real: Vectors, seed: int = 7, texts: Callable[[int], str] | None = None) -> TopUp:
    """`plan.filler_count` unit vectors, the i-th drawn around real vector i mod len(real), with the texts
    `texts(i)` (default: `plan.filler_text`). The noise is drawn in chunks (a million vectors' at once would be
    3 GB of float64), the same draws as in one: a smaller top-up is the first part of a larger one."""
    count, dimensions = plan.filler_count, real.shape[1]
    rng = np.random.default_rng(seed)
    sigma = float(np.sqrt(1 / FILLER_COSINE**2 - 1))  # noise of norm sigma on a unit vector: cosine 1/sqrt(1+s^2)
    vectors = np.empty((count, dimensions), dtype=np.float32)
    for at in range(0, count, NOISE_CHUNK):
        rows = np.arange(at, min(at + NOISE_CHUNK, count))
        noise = rng.standard_normal((len(rows), dimensions)).astype(np.float32) * (sigma / np.sqrt(dimensions))
        vectors[rows] = unit(real[rows % len(real)] + noise)
    text = texts or plan.filler_text
    return TopUp(vectors, [text(j) for j in range(count)])


def stored_vectors(search_path: Path, ids: Sequence[str]) -> Vectors:
    """The vectors the stopped gateway's store holds for `ids`, read from its shard: the exact search's reference
    must use the very vectors the engine searched, not the same texts embedded again in other batches."""
    from qdrant_edge import EdgeShard

    from gateway.search.embedded_points import point_id
    from gateway.search.shard_index import live_folder

    shard = EdgeShard.load(str(live_folder(search_path / "collections" / COLLECTION)))
    try:
        vectors: dict[str, Any] = {}
        for at in range(0, len(ids), WRITE_BATCH):
            chunk: list[int | uuid.UUID | str] = [point_id(i) for i in ids[at : at + WRITE_BATCH]]
            vectors.update((str(record.id), record.vector) for record in shard.retrieve(chunk, False, True))
    finally:
        shard.close()
    return unit(np.asarray([vectors[point_id(i)] for i in ids], dtype=np.float32))


async def write_top_up(search_path: Path, plan: Plan, top_up: TopUp) -> None:
    """Upsert the top-up into the collection the gateway created (the gateway must be stopped), then wait until
    the store has built its HNSW index, as a gateway that had been fed the documents would have."""
    from gateway.search.embedded import EmbeddedStore
    from gateway.search.store import DocumentWrite

    store = EmbeddedStore(search_path)
    try:
        started = time.perf_counter()
        now = int(time.time())
        for at in range(0, len(top_up.vectors), WRITE_BATCH):
            writes = [
                DocumentWrite(
                    f"f{j}", top_up.texts[j], plan.filler_metadata(j), top_up.vectors[j], analyze(top_up.texts[j])
                )
                for j in range(at, min(at + WRITE_BATCH, len(top_up.vectors)))
            ]
            await store.upsert(COLLECTION, writes, now)
        top_up.write_s = time.perf_counter() - started
        started = time.perf_counter()
        await store.wait_indexed()
        top_up.index_s = time.perf_counter() - started
    finally:
        await store.aclose()
