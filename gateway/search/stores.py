"""Choose the vector store from the settings: Milvus when SEARCH_MILVUS_URI is set, else the embedded one; none
when search is disabled."""

from __future__ import annotations

from gateway.search.embedded import EmbeddedStore
from gateway.search.milvus import MilvusStore
from gateway.search.store import VectorStore
from gateway.settings import SearchSettings


def build_vector_store(settings: SearchSettings) -> VectorStore | None:
    if not settings.enabled:
        return None
    if settings.milvus_uri:
        return MilvusStore(
            settings.milvus_uri,
            settings.milvus_token,
            timeout_seconds=settings.timeout_seconds,
            max_threads=settings.max_threads,
        )
    return EmbeddedStore(settings.path, max_threads=settings.max_threads)
