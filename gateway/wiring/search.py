"""Search: the vector store (embedded or Milvus), its chunked collections' documents and the re-index jobs."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from gateway.redis_client import RedisConnection
from gateway.search.store import VectorStore
from gateway.search.stores import build_job_store, build_vector_store
from gateway.services.embeddings import EmbeddingService
from gateway.services.search_chunks import ChunkedDocuments, Chunker
from gateway.services.search_reindex import ReindexJobs
from gateway.settings import SearchSettings, TaskStoreSettings
from gateway.wiring.shared import replica_name

log = logging.getLogger(__name__)


@asynccontextmanager
async def search_parts(
    config: SearchSettings,
    tasks: TaskStoreSettings,
    embeddings: EmbeddingService,
    redis: RedisConnection | None,
    chunker: Chunker | None,
    chunker_model: str,
) -> AsyncIterator[tuple[VectorStore | None, ReindexJobs | None, ChunkedDocuments | None]]:
    """The store (None: search is disabled), chunked collections' documents (drawn by `chunker`) and the re-index
    jobs; unfinished jobs resume now. The store opens nothing yet: a folder it cannot use degrades search, not the
    start."""
    async with AsyncExitStack() as stack:
        store = build_vector_store(config, redis)
        if store is None:
            log.info("semantic search is disabled (SEARCH_ENABLED=false)")
            yield None, None, None
            return
        chunks = ChunkedDocuments(store, embeddings, chunker, chunker_model)
        stack.push_async_callback(store.aclose)
        job_tasks = build_job_store(config, redis)
        stack.push_async_callback(job_tasks.aclose)
        jobs = ReindexJobs(
            job_tasks,
            store,
            embeddings,
            chunks,
            owner=replica_name(),
            retention_seconds=tasks.retention_seconds,
            lease_seconds=tasks.lease_seconds,
            scan_interval_seconds=tasks.scan_interval_seconds,
        )
        await jobs.start()
        stack.push_async_callback(jobs.aclose)
        yield store, jobs, chunks
