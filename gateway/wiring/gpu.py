"""The GPU policy: built when GPU_METRICS_URLS names endpoints and the gateway calls a real Triton, and its poller,
run for the life of the app."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.gpu.poller import GpuMetricsPoller
from gateway.gpu.protection import GpuProtection
from gateway.services.embeddings import Embedder
from gateway.settings import GpuSettings, TritonSettings
from gateway.upstreams.triton import TritonClient


def gpu_protection(gpu: GpuSettings, triton: TritonSettings, embedder: Embedder | None) -> GpuProtection | None:
    """None without GPU_METRICS_URLS, or with a stand-in `embedder` (tests: no Triton, no GPU)."""
    if not gpu.urls() or embedder is not None:
        return None
    return GpuProtection(gpu, triton.max_in_flight_calls)


@asynccontextmanager
async def gpu_poller(gpu: GpuSettings, protection: GpuProtection, client: TritonClient) -> AsyncIterator[None]:
    """Poll the GPUs' metrics until the block ends; each endpoint is mapped to the Triton addresses `client` calls."""
    poller = GpuMetricsPoller(gpu, protection, lambda: client.addresses)
    await poller.start()
    try:
        yield
    finally:
        await poller.aclose()
