"""Semantic search, framework-free: collections, document upserts embedded through the embeddings service and
analyzed into terms, and searches checked here and answered by `search_query.py` (by meaning, by words or both),
with metadata filters, over one `VectorStore`; a chunked collection's documents by `search_chunks.py`.

A collection remembers the model and revision its vectors came from; while another revision is served, its
upserts and searches answer 409 (vectors of two revisions are never compared or mixed) until a re-index job
(`search_reindex.py`, which has these rules) has re-embedded it; during the job its searches and writes answer 409
too. With search turned off
(SEARCH_ENABLED=false) there is no store and every call answers 503 `search_disabled` before any other work.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.errors import (
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    UpstreamUnavailableError,
)
from gateway.search.analyzer import ANALYZER
from gateway.search.documents import (
    Chunking,
    Collection,
    Document,
    Hit,
    check_collection_name,
    check_document_id,
    check_metadata,
)
from gateway.search.filters import parse_filter
from gateway.search.fusion import Fusion
from gateway.search.store import DocumentWrite, VectorStore
from gateway.services.embeddings import EmbeddingService
from gateway.services.rerank import RerankService
from gateway.services.search_chunks import ChunkedDocuments, check_chunking
from gateway.services.search_query import (
    RERANK_CANDIDATES,
    SEARCH_MODES,
    SearchQueries,
    SearchResult,
    check_mode,
    check_rerank,
)
from gateway.services.search_reindex import ReindexJobs, check_revision, check_writable
from gateway.services.search_terms import terms_beside
from gateway.services.texts import check_count, check_text
from gateway.settings import LimitSettings
from gateway.tasks.model import Task
from gateway.usage.record import Usage

# Collection, Document and Task are what the transports are handed: they import them from here, not from the stores.
__all__ = [
    "MAX_COLLECTION_METADATA_BYTES",
    "MAX_DOCUMENTS_PER_CALL",
    "MAX_QUERY_INSTRUCTION_CHARS",
    "MAX_TOP_K",
    "READY_TIMEOUT_SECONDS",
    "RERANK_CANDIDATES",
    "SEARCH_MODES",
    "Chunking",
    "Collection",
    "Document",
    "DocumentNotFoundError",
    "Fusion",
    "Hit",
    "NewDocument",
    "SearchDisabledError",
    "SearchResult",
    "SearchService",
    "Task",
    "UpsertResult",
    "check_revision",
    "check_writable",
]  # fmt: skip

MAX_DOCUMENTS_PER_CALL = 1000
MAX_TOP_K = 100
MAX_COLLECTION_METADATA_BYTES = 16 * 1024
MAX_QUERY_INSTRUCTION_CHARS = 1024
READY_TIMEOUT_SECONDS = 1.0


@dataclass(frozen=True)
class NewDocument:
    id: str
    text: str
    metadata: dict[str, Any]


@dataclass(frozen=True)
class UpsertResult:
    ids: list[str]  # in request order, each once
    prompt_tokens: int
    truncated: list[str]  # ids of documents whose text was cut at the model's maximum tokens
    model: str  # the embedding model, what the usage record counts it under

    @property
    def usage(self) -> Usage:
        return Usage(search_documents=len(self.ids), embedding_texts=len(self.ids), embedding_tokens=self.prompt_tokens)


class SearchDisabledError(UpstreamUnavailableError):
    """A search route or gRPC `Search` call on a gateway with `SEARCH_ENABLED=false` (the Helm chart's default):
    a setting, not an outage.

    Do: operator: set `SEARCH_ENABLED=true` (Helm: `search.enabled`) with `SEARCH_MILVUS_URI`, or one replica
    with a persistent `SEARCH_PATH`.
    """

    code = "search_disabled"

    def __init__(self) -> None:
        super().__init__(
            "semantic search is disabled on this gateway; set SEARCH_ENABLED=true (Helm: search.enabled=true, "
            "with search.milvusUri or a persistent search.path) to serve /v1/collections"
        )


class SearchService:
    """`store` None: search is disabled."""

    def __init__(
        self,
        store: VectorStore | None,
        embeddings: EmbeddingService,
        limits: LimitSettings,
        jobs: ReindexJobs | None = None,
        reranker: RerankService | None = None,
        chunks: ChunkedDocuments | None = None,
    ) -> None:
        self._backend = store
        self._embeddings = embeddings
        self._limits = limits
        self._jobs = jobs
        self._chunked = chunks
        self._queries = None if store is None else SearchQueries(store, embeddings, reranker, chunks)

    def check_enabled(self) -> None:
        """Raise `SearchDisabledError` when search is disabled (the REST routes call it before reading a body)."""
        if self._backend is None:
            raise SearchDisabledError()

    @property
    def _store(self) -> VectorStore:
        if self._backend is None:
            raise SearchDisabledError()
        return self._backend

    async def readiness(self) -> Literal["ok", "degraded", "disabled"]:
        """Whether the store answers within a second (readiness probes must not hang on a dead Milvus)."""
        if self._backend is None:
            return "disabled"
        try:
            ready = await asyncio.wait_for(self._backend.ready(), READY_TIMEOUT_SECONDS)
        except TimeoutError:
            ready = False
        return "ok" if ready else "degraded"

    async def create_collection(
        self,
        name: str,
        query_instruction: str | None,
        metadata: dict[str, Any] | None,
        chunking: Chunking | None = None,
    ) -> Collection:
        store = self._store
        check_collection_name(name)
        if query_instruction is not None and len(query_instruction) > MAX_QUERY_INSTRUCTION_CHARS:
            raise InvalidRequestError(
                f"query_instruction has at most {MAX_QUERY_INSTRUCTION_CHARS} characters", param="query_instruction"
            )
        if metadata is not None and len(orjson.dumps(metadata)) > MAX_COLLECTION_METADATA_BYTES:
            raise InvalidRequestError(
                f"metadata is at most {MAX_COLLECTION_METADATA_BYTES} bytes of JSON", param="metadata"
            )
        info = await self._embeddings.model_info()
        if chunking is not None:
            check_chunking(chunking, info.max_sequence_length)
        collection = Collection(
            name,
            info.name,
            info.revision,
            info.dimension,
            int(time.time()),
            query_instruction,
            metadata or {},
            lexical=ANALYZER if await store.lexical() else None,
            chunking=chunking,
        )
        await store.create_collection(collection)
        return collection

    async def get_collection(self, name: str) -> Collection:
        store = self._store
        check_collection_name(name)
        return await store.get_collection(name)

    async def list_collections(self) -> list[Collection]:
        return await self._store.list_collections()

    async def delete_collection(self, name: str) -> None:
        store = self._store
        check_collection_name(name)
        await store.delete_collection(name)

    async def upsert(self, name: str, documents: Sequence[NewDocument], *, use_cache: bool = True) -> UpsertResult:
        store = self._store
        check_collection_name(name)
        check_count(len(documents), "documents", MAX_DOCUMENTS_PER_CALL)
        for index, document in enumerate(documents):
            self._check(index, document)
        unique = list({d.id: d for d in documents}.values())  # a repeated id: its last version is the one kept
        collection = await self._current(name)
        if collection.chunking is not None:
            tokens, model = await self._chunks.upsert(
                name, collection.chunking, unique, int(time.time()), use_cache=use_cache
            )
            return UpsertResult([d.id for d in unique], tokens, [], model)
        texts = [d.text for d in unique]
        terms, result = await terms_beside(texts, self._embeddings.embed(texts, use_cache=use_cache, gpu_work="upsert"))
        writes = [
            DocumentWrite(d.id, d.text, d.metadata, vector, t)
            for d, vector, t in zip(unique, result.vectors, terms, strict=True)
        ]
        await store.upsert(name, writes, int(time.time()))
        cut = [d.id for d, truncated in zip(unique, result.truncated, strict=True) if truncated]
        return UpsertResult([d.id for d in unique], result.prompt_tokens, cut, result.model)

    async def reindex(self, name: str) -> tuple[Task, bool]:
        """Start re-embedding the collection with the served model (a durable job); the job already under way
        (False) if there is one."""
        check_collection_name(name)
        return await self._reindex_jobs.submit(name)

    async def reindex_task(self, name: str, task_id: str) -> Task:
        check_collection_name(name)
        return await self._reindex_jobs.get(name, task_id)

    async def watch_reindex_task(self, name: str, task_id: str) -> AsyncGenerator[Task, None]:
        """The job now and at each change, ending with its final state (404 up front)."""
        check_collection_name(name)
        return await self._reindex_jobs.watch(name, task_id)

    @property
    def _reindex_jobs(self) -> ReindexJobs:
        if self._jobs is None:
            raise SearchDisabledError()
        return self._jobs

    async def get_document(self, name: str, document_id: str) -> Document:
        store = self._store
        check_collection_name(name)
        check_document_id(document_id)
        if (await store.collection(name)).chunking is not None:
            found = await self._chunks.get(name, [document_id])
        else:
            found = await store.get_documents(name, [document_id])
        if not found:
            raise DocumentNotFoundError(name, document_id)
        return found[0]

    async def delete_document(self, name: str, document_id: str) -> None:
        store = self._store
        check_collection_name(name)
        check_document_id(document_id)
        collection = await store.collection(name)
        check_writable(collection)
        delete = self._chunks.delete if collection.chunking is not None else store.delete_documents
        if not await delete(name, [document_id]):
            raise DocumentNotFoundError(name, document_id)

    async def delete_documents(self, name: str, ids: list[str] | None, where: object | None) -> int:
        """By ids or by a filter (exactly one of them); answers how many documents were deleted."""
        store = self._store
        check_collection_name(name)
        if (ids is None) == (where is None):
            raise InvalidRequestError("send either ids or filter", param="ids")
        collection = await store.collection(name)
        check_writable(collection)
        chunked = collection.chunking is not None
        if ids is not None:
            if len(ids) > MAX_DOCUMENTS_PER_CALL:
                raise PayloadTooLargeError(
                    f"{len(ids)} ids in one call; the maximum is {MAX_DOCUMENTS_PER_CALL}", param="ids"
                )
            for index, document_id in enumerate(ids):
                check_document_id(document_id, f"ids[{index}]")
            if not ids:
                return 0
            return await (self._chunks.delete(name, ids) if chunked else store.delete_documents(name, ids))
        parsed = parse_filter(where)
        return await (self._chunks.delete_matching(name, parsed) if chunked else store.delete_matching(name, parsed))

    @property
    def _searching(self) -> SearchQueries:
        if self._queries is None:
            raise SearchDisabledError()
        return self._queries

    @property
    def _chunks(self) -> ChunkedDocuments:
        if self._chunked is None:  # search disabled, or a service built without chunking (tests)
            raise SearchDisabledError()
        return self._chunked

    async def search(
        self,
        name: str,
        query: str,
        *,
        top_k: int = 10,
        where: object | None = None,
        min_score: float | None = None,
        mode: str = "dense",
        fusion: Fusion | None = None,
        rerank_candidates: int | None = None,
        use_cache: bool = True,
    ) -> SearchResult:
        """`mode`: dense (by meaning: the query's vector), lexical (BM25 over the analyzer's terms) or hybrid
        (both, fused by `fusion`). `rerank_candidates`: the reranker scores that many of the mode's best hits and
        the best `top_k` of them come back by its relevance. `min_score` applies to the score answered."""
        queries = self._searching
        check_collection_name(name)
        if not 1 <= top_k <= MAX_TOP_K:
            raise InvalidRequestError(f"top_k is 1 to {MAX_TOP_K}, got {top_k}", param="top_k")
        self._check_text(query, "query")
        check_mode(mode, fusion)
        if rerank_candidates is not None:
            check_rerank(rerank_candidates, top_k)
        parsed = parse_filter(where) if where else None  # {} filters nothing out
        collection = await self._current(name)
        return await queries.answer(
            collection,
            query,
            top_k=top_k,
            where=parsed,
            min_score=min_score,
            mode=mode,
            fusion=fusion,
            rerank_candidates=rerank_candidates,
            use_cache=use_cache,
        )

    async def _current(self, name: str) -> Collection:
        """The collection, if its vectors come from the model served now (else 409: re-index)."""
        collection = await self._store.collection(name)
        check_revision(collection, await self._embeddings.model_info())
        return collection

    def _check(self, index: int, document: NewDocument) -> None:
        check_document_id(document.id, f"documents[{index}].id")
        self._check_text(document.text, f"documents[{index}].text")
        check_metadata(document.metadata, f"documents[{index}].metadata")

    def _check_text(self, text: str, where: str) -> None:
        check_text(text, where, self._limits.max_text_chars)


class DocumentNotFoundError(NotFoundError):
    """The collection has no document with the id the request names.

    Do: check the id; a document is read by the id it was upserted with.
    """

    code = "document_not_found"

    def __init__(self, collection: str, document_id: str) -> None:
        super().__init__(f"collection {collection!r} has no document {document_id!r}", param="id")
