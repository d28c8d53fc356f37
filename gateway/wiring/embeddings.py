"""Embeddings: Triton's client (coalesced) and the embedding cache around the embedding service; the same client
reranks. The GPU policy, where there is one, steers the client's calls and sets the coalescer's in-flight limit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from gateway.cache.embeddings import EmbeddingCache
from gateway.cache.stores import build_store
from gateway.gpu.protection import GpuProtection
from gateway.redis_client import RedisConnection
from gateway.services.coalescing import CoalescingEmbedder
from gateway.services.embeddings import Embedder, EmbeddingService
from gateway.settings import CacheSettings, LimitSettings, TritonSettings
from gateway.upstreams.triton import TritonClient


@asynccontextmanager
async def embedding_service(
    triton: TritonSettings,
    cache: CacheSettings,
    limits: LimitSettings,
    redis: RedisConnection | None,
    embedder: Embedder | None = None,
    gpu: GpuProtection | None = None,
) -> AsyncIterator[tuple[EmbeddingService, Embedder, TritonClient | None]]:
    """The embedding service, the embedder it calls (Triton's, or `embedder`, which tests may pass) and Triton's
    client (None with `embedder`)."""
    async with AsyncExitStack() as stack:
        client = None
        if embedder is None:
            client = TritonClient(triton, rank=None if gpu is None else gpu.rank)
            stack.push_async_callback(client.aclose)
            coalescer = CoalescingEmbedder(
                client, max_in_flight=triton.max_in_flight_calls, max_queue_seconds=triton.max_queue_seconds
            )
            if gpu is not None:
                gpu.on_limit(coalescer.set_max_in_flight)
            embedder = coalescer
        vectors = None
        if redis is not None or cache.embedding_cache_mb > 0:
            vectors = EmbeddingCache(
                build_store(redis, memory_mb=cache.embedding_cache_mb), ttl_seconds=cache.embedding_cache_ttl_seconds
            )
            stack.push_async_callback(vectors.aclose)
        yield EmbeddingService(embedder, vectors, limits, gpu), embedder, client
