"""Re-index jobs over the real embedded store and SQLite task store, with an embedder whose served revision the
test changes: a revision that changes during the job restarts it with the new one, and a model with other
dimensions is refused before anything is touched."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from gateway.errors import ConflictError
from gateway.search.analyzer import ANALYZER, analyze
from gateway.search.documents import Collection
from gateway.search.embedded import EmbeddedStore
from gateway.search.store import DocumentWrite
from gateway.services.embeddings import EmbeddingService
from gateway.services.search_reindex import PAGE_DOCUMENTS, ReindexJobs
from gateway.settings import LimitSettings
from gateway.tasks.model import TaskState
from gateway.tasks.sqlite_store import SqliteTaskStore
from gateway.upstreams.triton import ModelInfo, TritonEmbeddings

DIMENSIONS = 4
DOCUMENTS = PAGE_DOCUMENTS + PAGE_DOCUMENTS // 2  # two pages


class SwitchingEmbedder:
    """Serves `revision`; after `switch_after` calls it serves `next_revision`. Records who embedded what."""

    def __init__(self, revision: str, dimension: int = DIMENSIONS) -> None:
        self.revision = revision
        self.dimension = dimension
        self.switch_after: int | None = None
        self.next_revision = ""
        self.embedded: list[tuple[str, str]] = []  # (revision, text)

    async def model_info(self, *, refresh: bool = False) -> ModelInfo:
        return ModelInfo("m", self.revision, max_batch_size=256, max_sequence_length=64, dimension=self.dimension)

    async def embed(self, texts: list[str]) -> TritonEmbeddings:
        self.embedded += [(self.revision, text) for text in texts]
        rows = np.zeros((len(texts), self.dimension), dtype=np.float32)
        rows[:, 0] = 1.0
        if self.switch_after is not None:
            self.switch_after -= 1
            if self.switch_after == 0:
                self.revision = self.next_revision
        return TritonEmbeddings(rows, np.ones(len(texts), dtype=np.int32), np.zeros(len(texts), dtype=np.bool_))

    async def ready(self) -> bool:
        return True


async def stored_collection(store: EmbeddedStore, revision: str) -> None:
    await store.create_collection(Collection("c", "m", revision, DIMENSIONS, int(time.time()), None))
    vector = np.array([0.0, 1.0, 0.0, 0.0], dtype=np.float32)
    documents = [
        DocumentWrite(f"d{n:03}", f"text {n}", {"n": n}, vector, analyze(f"text {n}")) for n in range(DOCUMENTS)
    ]
    await store.upsert("c", documents, now=1)


def jobs(tmp_path: Path, store: EmbeddedStore, embedder: SwitchingEmbedder) -> ReindexJobs:
    embeddings = EmbeddingService(embedder, None, LimitSettings())
    return ReindexJobs(
        SqliteTaskStore(str(tmp_path / "jobs.sqlite3")),
        store,
        embeddings,
        owner="test",
        retention_seconds=60,
        lease_seconds=5,
        scan_interval_seconds=0.05,
    )


async def test_a_revision_served_during_the_job_restarts_it_with_that_revision(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "search")
    embedder = SwitchingEmbedder("rev2")
    embedder.switch_after, embedder.next_revision = 1, "rev3"  # after the first page
    await stored_collection(store, "rev1")
    runner = jobs(tmp_path, store, embedder)
    await runner.start()
    try:
        task, created = await runner.submit("c")
        assert created and task.arguments["model_revision"] == "rev2"
        while not task.state.terminal:
            await asyncio.sleep(0.01)
            task = await runner.get("c", task.id)
        assert task.state == TaskState.COMPLETED and task.arguments["model_revision"] == "rev3"
        assert (task.result or {})["documents"] == DOCUMENTS
        assert sorted(text for revision, text in embedder.embedded if revision == "rev3") == sorted(
            f"text {n}" for n in range(DOCUMENTS)
        )
        collection = await store.get_collection("c")
        assert (collection.model_revision, collection.reindex_task) == ("rev3", None)
        assert collection.documents == DOCUMENTS
        hits = await store.search("c", np.array([1.0, 0, 0, 0], dtype=np.float32), DOCUMENTS, None, None)
        assert len(hits) == DOCUMENTS and min(hit.score for hit in hits) > 0.99  # every vector replaced
    finally:
        await runner.aclose()
        await store.aclose()


async def test_a_model_with_other_dimensions_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "search")
    await stored_collection(store, "rev1")
    runner = jobs(tmp_path, store, SwitchingEmbedder("rev2", dimension=8))
    try:
        with pytest.raises(ConflictError) as refused:
            await runner.submit("c")
        assert refused.value.code == "dimensions_changed" and "create a new collection" in refused.value.message
        collection = await store.collection("c")
        assert (collection.model_revision, collection.reindex_task) == ("rev1", None)
    finally:
        await runner.aclose()
        await store.aclose()


async def test_a_collection_written_before_lexical_search_gets_its_terms_without_being_embedded_again(
    tmp_path: Path,
) -> None:
    store = EmbeddedStore(tmp_path / "search")
    await store.create_collection(Collection("c", "m", "rev1", DIMENSIONS, int(time.time()), None, lexical=None))
    vector = np.array([0.0, 1.0, 0.0, 0.0], dtype=np.float32)
    old = [DocumentWrite(f"d{n:03}", f"text {n}", {"n": n}, vector, "") for n in range(DOCUMENTS)]  # no terms
    await store.upsert("c", old, now=1)
    assert await store.lexical_search("c", analyze("text 5"), 3, None, None) == []
    embedder = SwitchingEmbedder("rev1")  # the collection's own revision: nothing to re-embed
    runner = jobs(tmp_path, store, embedder)
    await runner.start()
    try:
        task, _ = await runner.submit("c")
        while not task.state.terminal:
            await asyncio.sleep(0.01)
            task = await runner.get("c", task.id)
        assert task.state == TaskState.COMPLETED and (task.result or {})["documents"] == DOCUMENTS
        assert embedder.embedded == []
        collection = await store.collection("c")
        assert (collection.lexical, collection.model_revision, collection.reindex_task) == (ANALYZER, "rev1", None)
        hits = await store.lexical_search("c", analyze("text 5"), 3, None, None)
        assert hits[0].id == "d005" and len(hits) == 3  # every document has "text"; one has "5"
        dense = await store.search("c", vector, 1, None, None)
        assert dense[0].score > 0.99  # the vectors were kept
    finally:
        await runner.aclose()
        await store.aclose()
