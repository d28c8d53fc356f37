"""The embedded store's shards as Qdrant Edge runs them: searched with one thread of the engine's pool (also a
shard written before that setting, and an indexed copy swapped in), off the event loop's thread, and an
engine that fails a search answers unavailable, naming the store."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import REGISTRY
from qdrant_edge import EdgeConfig, EdgeOptimizersConfig, EdgeShard

from gateway.search import embedded_points
from gateway.search.analyzer import analyze
from gateway.search.documents import Collection
from gateway.search.embedded import EmbeddedStore
from gateway.search.embedded_files import HNSW, SEARCH_THREADS, vector_params, write_record
from gateway.search.shard_index import LIVE, live_folder
from gateway.search.store import DocumentWrite, SearchStoreUnavailableError

pytestmark = pytest.mark.slow

DIMENSIONS = 8


def writes(count: int, seed: int = 3) -> list[DocumentWrite]:
    vectors = np.random.default_rng(seed).standard_normal((count, DIMENSIONS)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [DocumentWrite(str(n), f"text {n}", {"n": n}, vectors[n], analyze(f"text {n}")) for n in range(count)]


def collection() -> Collection:
    return Collection(f"c-{uuid.uuid4().hex[:8]}", "model", "rev1", DIMENSIONS, 1_700_000_000, None, {})


def search_threads(root: Path, name: str) -> Any:
    """What the live shard's configuration on disk says (the engine reads it when it loads the shard)."""
    config = json.loads((live_folder(root / "collections" / name) / "edge_config.json").read_text())
    return config.get("max_search_threads")


async def test_shards_search_with_one_engine_thread_also_old_ones_and_indexed_copies(tmp_path: Path) -> None:
    root = tmp_path / "search"
    new, old = collection(), collection()
    documents = writes(1500)
    # A collection written before the setting: its shard has the engine's default pool.
    (root / "collections" / old.name).mkdir(parents=True)
    config = EdgeConfig(
        vectors=vector_params(old), hnsw_config=HNSW, optimizers=EdgeOptimizersConfig(indexing_threshold=1)
    )
    EdgeShard.create(str(root / "collections" / old.name / LIVE), config).close()
    write_record(root / "collections", old)
    assert search_threads(root, old.name) is None

    store = EmbeddedStore(root, index_after_points=1000, indexing_threshold_kb=1)
    try:
        await store.create_collection(new)
        assert search_threads(root, new.name) == SEARCH_THREADS
        await store.upsert(old.name, documents, now=1)  # opens the old shard, then indexes a copy of it
        assert search_threads(root, old.name) == SEARCH_THREADS
        await store.wait_indexed()
        assert live_folder(root / "collections" / old.name).name != LIVE  # the indexed copy is live
        assert search_threads(root, old.name) == SEARCH_THREADS
        for n in (0, 700, 1499):
            hits = await store.search(old.name, documents[n].vector, 1, None, None)
            assert hits[0].id == str(n)
            # the terms' index came with the shard written before it, and with the indexed copy
            assert [h.id for h in await store.lexical_search(old.name, str(n), 2, None, None)] == [str(n)]
    finally:
        await store.aclose()


async def test_a_search_runs_off_the_loops_thread_and_a_failing_engine_answers_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    created = collection()
    documents = writes(20)
    ran_on: list[int] = []
    query = embedded_points.query

    def watched(shard: EdgeShard, request: Any) -> Any:
        ran_on.append(threading.get_ident())
        return query(shard, request)

    monkeypatch.setattr(embedded_points, "query", watched)
    labels = {"store": "embedded", "operation": "watched"}

    store = EmbeddedStore(tmp_path / "search")
    try:
        await store.create_collection(created)
        await store.upsert(created.name, documents, now=1)
        assert (await store.search(created.name, documents[4].vector, 1, None, None))[0].id == "4"
        assert len(ran_on) == 1 and ran_on[0] != threading.get_ident(), "the engine's call holds no request up"
        errors = REGISTRY.get_sample_value("gateway_search_store_errors_total", labels) or 0.0
        store._shards[created.name].close()  # the engine now fails every call on this shard
        with pytest.raises(SearchStoreUnavailableError) as failed:
            await store.search(created.name, documents[4].vector, 1, None, None)
        assert "search store (embedded)" in failed.value.message and failed.value.status_code == 503
        assert REGISTRY.get_sample_value("gateway_search_store_errors_total", labels) == errors + 1
    finally:
        store._shards.clear()  # closed above already
        await store.aclose()
