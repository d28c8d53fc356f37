"""A rerank is bulk work (one cross-encoder run per document): refused while no Triton has GPU memory to spare,
before anything reaches Triton, and served again once one has."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.gpu.metrics_text import GpuReading
from gateway.gpu.protection import ALL, GpuMemoryHighError, GpuProtection, SeenGpu
from gateway.services.rerank import RerankService
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
