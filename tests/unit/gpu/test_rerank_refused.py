"""A rerank is bulk work (one cross-encoder run per document): refused while no Triton has GPU memory to spare,
before anything reaches Triton, and served again once one has."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from gateway.gpu.metrics_text import GpuReading
from gateway.gpu.protection import ALL, GpuMemoryHighError, GpuProtection, SeenGpu
from gateway.search.analyzer import ANALYZER, analyze
from gateway.search.documents import Collection, Hit
from gateway.search.embedded import EmbeddedStore
from gateway.search.filters import Filter
from gateway.search.store import DocumentWrite
from gateway.services.embeddings import EmbeddingService
from gateway.services.rerank import RerankService
from gateway.services.search_query import SearchQueries
from gateway.settings import GpuSettings, LimitSettings
from gateway.upstreams.triton_reranker import RerankerInfo, TritonScores

GIB = 1 << 30


class CountingReranker:
    """Scores each document by its length; counts the calls that would reach Triton."""

    def __init__(self) -> None:
        self.calls = 0

    async def reranker_info(self) -> RerankerInfo:
        return RerankerInfo("bge-reranker", "r1", 64, 512)

    async def rerank(self, query: str, documents: list[str]) -> TritonScores:
        self.calls += 1
        return TritonScores(
            np.array([len(d) for d in documents], np.float32), np.ones(len(documents), np.int32), np.zeros(2, bool)
        )


def memory(guard: GpuProtection, fraction: float) -> None:
    reading = GpuReading("GPU-a", "triton", fraction * 16 * GIB, 16 * GIB)
    guard.observe({"GPU-a": SeenGpu(reading, ALL)}, ["127.0.0.1:8001"])


async def test_a_rerank_is_refused_while_gpu_memory_is_high() -> None:
    guard = GpuProtection(GpuSettings(metrics_urls="http://x/metrics", metrics_interval_seconds=1), 4)
    reranker = CountingReranker()
    service = RerankService(reranker, LimitSettings(), gpu=guard)
    memory(guard, 0.95)
    with pytest.raises(GpuMemoryHighError) as refused:
        await service.rerank("reset password", ["Click Reset password.", "Stores open at nine."])
    assert refused.value.headers["Retry-After"] == "2"
    assert reranker.calls == 0
    memory(guard, 0.5)
    ranked = await service.rerank("reset password", ["Click Reset password.", "Stores open at nine."])
    assert [r.index for r in ranked.results] == [0, 1] and reranker.calls == 1


class CountingStore(EmbeddedStore):
    """The embedded store, counting the lexical searches asked of it."""

    lexical_searches = 0

    async def lexical_search(
        self, name: str, terms: str, top_k: int, where: Filter | None, min_score: float | None
    ) -> list[Hit]:
        self.lexical_searches += 1
        return await super().lexical_search(name, terms, top_k, where, min_score)


async def test_a_search_that_asks_for_a_rerank_is_refused_before_it_retrieves(tmp_path: Path) -> None:
    guard = GpuProtection(GpuSettings(metrics_urls="http://x/metrics", metrics_interval_seconds=1), 4)
    store = CountingStore(tmp_path / "search")
    collection = Collection("kb", "m", "r", 2, 0, None, {}, lexical=ANALYZER)
    await store.create_collection(collection)
    vector = np.array([1.0, 0.0], np.float32)
    texts = ["Click Reset password.", "Stores open at nine."]
    await store.upsert("kb", [DocumentWrite(f"d{n}", t, {}, vector, analyze(t)) for n, t in enumerate(texts)], 1)
    reranker = CountingReranker()
    queries = SearchQueries(
        store, cast(EmbeddingService, None), RerankService(reranker, LimitSettings(), gpu=guard), None
    )
    search = partial(queries.answer, collection, "reset password", top_k=1, where=None, min_score=None,
                     mode="lexical", fusion=None, rerank_candidates=2, use_cache=True)  # fmt: skip
    memory(guard, 0.95)
    with pytest.raises(GpuMemoryHighError):
        await search()
    assert (store.lexical_searches, reranker.calls) == (0, 0)
    memory(guard, 0.5)
    assert [h.id for h in (await search()).hits] == ["d0"] and (store.lexical_searches, reranker.calls) == (1, 1)
    await store.aclose()
