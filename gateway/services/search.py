"""Semantic search, framework-free: collections, document upserts embedded through the embeddings service and
analyzed into terms, and searches by meaning (dense), by words (lexical: BM25) or both fused (hybrid), with
metadata filters, over one `VectorStore`.

A collection remembers the model and revision its vectors came from; while another revision is served, its
upserts and searches answer 409 (vectors of two revisions are never compared or mixed) until a re-index job
(`search_reindex.py`) has re-embedded it; during the job its searches and writes answer 409 too. With search turned off
(SEARCH_ENABLED=false) there is no store and every call answers 503 `search_disabled` before any other work.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import orjson

from gateway.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    UpstreamUnavailableError,
)
from gateway.search.analyzer import ANALYZER, analyze
from gateway.search.documents import (
    Chunking,
    Collection,
    Document,
    Hit,
    check_collection_name,
    check_document_id,
    check_metadata,
)
from gateway.search.filters import Filter, parse_filter
from gateway.search.fusion import Fusion, fuse
from gateway.search.store import DocumentWrite, LexicalSearchUnavailableError, VectorStore
from gateway.services.embeddings import EmbeddingResult, EmbeddingService
from gateway.services.rerank import MAX_DOCUMENTS as MAX_RERANK_DOCUMENTS
from gateway.services.rerank import RERANKER_ALIAS, RerankResult, RerankService
from gateway.services.search_chunks import ChunkedDocuments
from gateway.services.search_reindex import ReindexJobs
from gateway.services.search_terms import terms_beside
from gateway.services.texts import check_count, check_text
from gateway.settings import LimitSettings
from gateway.tasks.model import Task
from gateway.upstreams.triton import ModelInfo
from gateway.upstreams.triton_reranker import RerankerNotServedError
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

SEARCH_MODES = ("dense", "lexical", "hybrid")
# A search that answers `depth` points, and what makes `top_k` documents of it.
PointSearch = Callable[[int], Awaitable[list[Hit]]]
Finder = Callable[[PointSearch, int], Awaitable[list[Hit]]]
ScoreType = Literal["cosine", "bm25", "rrf", "weighted", "relevance"]
RERANK_CANDIDATES = 50  # hits of the search's mode the reranker scores when a search asks for a rerank
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


@dataclass(frozen=True)
class SearchResult:
    hits: list[Hit]
    prompt_tokens: int
    cached: bool  # the query's embedding came from the cache
    model: str
    score_type: ScoreType  # what each hit's `score` is
    embedded: bool = True  # the query was embedded (every mode but lexical)
    reranked: RerankResult | None = None  # the reranker's call, where the search asked for one

    @property
    def usage(self) -> Usage:
        return Usage(search_queries=1, embedding_texts=int(self.embedded), embedding_tokens=self.prompt_tokens)


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
        self._reranker = reranker
        self._chunked = chunks

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
            lexical=ANALYZER if store.lexical else None,
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
        terms, result = await terms_beside(texts, self._embeddings.embed(texts, use_cache=use_cache))
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
        store = self._store
        check_collection_name(name)
        if not 1 <= top_k <= MAX_TOP_K:
            raise InvalidRequestError(f"top_k is 1 to {MAX_TOP_K}, got {top_k}", param="top_k")
        self._check_text(query, "query")
        check_mode(mode, fusion)
        if rerank_candidates is not None:
            check_rerank(rerank_candidates, top_k)
        parsed = parse_filter(where) if where else None  # {} filters nothing out
        collection = await self._current(name)
        if mode != "dense":
            check_lexical(collection, store)
        depth, kept = (top_k, min_score) if rerank_candidates is None else (rerank_candidates, None)
        result = await self._retrieve(collection, query, mode, fusion, depth, parsed, kept, use_cache)
        if rerank_candidates is None:
            return result
        reranked = await self._rerank(query, result.hits, top_k, min_score)
        return dataclasses.replace(result, hits=reranked[0], score_type="relevance", reranked=reranked[1])

    async def _retrieve(
        self,
        collection: Collection,
        query: str,
        mode: str,
        fusion: Fusion | None,
        top_k: int,
        where: Filter | None,
        min_score: float | None,
        use_cache: bool,
    ) -> SearchResult:
        """The mode's best `top_k` documents (a chunked collection's: each once, by its best chunk, with its whole
        text)."""
        name, found = collection.name, self._finder(collection)

        def lexical(floor: float | None) -> Callable[[int], Awaitable[list[Hit]]]:
            return partial(self._lexical, name, query, where=where, min_score=floor)

        async def dense(depth: int, floor: float | None) -> tuple[EmbeddingResult, list[Hit]]:
            result = await self._embeddings.embed(
                [query], use_cache=use_cache, input_type="query", instruction=collection.query_instruction
            )
            vector = result.vectors[0]
            return result, await found(partial(self._store.search, name, vector, where=where, min_score=floor), depth)

        if mode == "lexical":
            hits = await self._texts(collection, await found(lexical(min_score), top_k))
            return SearchResult(hits, 0, False, collection.model, "bm25", embedded=False)
        if mode == "dense":
            result, hits = await dense(top_k, min_score)
            score_type: ScoreType = "cosine"
        else:
            fusion = fusion or Fusion()
            depth = max(top_k, fusion.candidates)
            # the words' search runs while Triton embeds the query
            words, (result, meaning) = await asyncio.gather(found(lexical(None), depth), dense(depth, None))
            hits = fuse({"dense": meaning, "lexical": words}, fusion, top_k)
            hits = [h for h in hits if min_score is None or h.score >= min_score]
            score_type = fusion.method
        hits = await self._texts(collection, hits)
        return SearchResult(hits, result.prompt_tokens, result.cache == "hit", result.model, score_type)

    def _finder(self, collection: Collection) -> Finder:
        """How `top_k` documents are read from a search that answers `depth` points."""
        if collection.chunking is not None:
            return self._chunks.found

        async def points(search: PointSearch, top_k: int) -> list[Hit]:
            return await search(top_k)

        return points

    async def _texts(self, collection: Collection, hits: list[Hit]) -> list[Hit]:
        return hits if collection.chunking is None else await self._chunks.with_texts(collection.name, hits)

    async def _rerank(
        self, query: str, hits: list[Hit], top_k: int, min_score: float | None
    ) -> tuple[list[Hit], RerankResult | None]:
        """The hits by the reranker's relevance, best `top_k`; each keeps its retrieval scores in `scores`."""
        if self._reranker is None:
            raise RerankerNotServedError(RERANKER_ALIAS)
        if not hits:
            return [], None
        # a chunked collection's document is judged by the chunk that found it: what fits the reranker's length
        texts = [h.text if h.chunk is None else h.chunk.text for h in hits]
        ranked = await self._reranker.rerank(query, texts, top_n=top_k)
        reranked = [
            dataclasses.replace(hits[r.index], score=r.relevance_score, scores=retrieval_scores(hits[r.index]))
            for r in ranked.results
        ]
        return [h for h in reranked if min_score is None or h.score >= min_score], ranked

    async def _lexical(
        self, name: str, query: str, top_k: int, where: Filter | None, min_score: float | None
    ) -> list[Hit]:
        terms = analyze(query)
        return await self._store.lexical_search(name, terms, top_k, where, min_score) if terms else []

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


def check_mode(mode: str, fusion: Fusion | None) -> None:
    if mode not in SEARCH_MODES:
        raise InvalidRequestError(f"mode is one of {', '.join(SEARCH_MODES)}; got {mode!r}", param="mode")
    if fusion is not None and mode != "hybrid":
        raise InvalidRequestError(f"fusion applies to mode hybrid, not {mode}", param="fusion")


MIN_CHUNK_TOKENS = 16


def check_chunking(chunking: Chunking, max_sequence_length: int) -> None:
    """Chunks that fit the served model, each sharing at most half of itself with the one before."""
    if not MIN_CHUNK_TOKENS <= chunking.max_tokens <= max_sequence_length:
        raise InvalidRequestError(
            f"chunking.max_tokens is {MIN_CHUNK_TOKENS} to the served model's maximum of {max_sequence_length} tokens, "
            f"got {chunking.max_tokens}",
            param="chunking.max_tokens",
        )
    if not 0 <= chunking.overlap <= chunking.max_tokens // 2:
        raise InvalidRequestError(
            f"chunking.overlap is 0 to half of max_tokens ({chunking.max_tokens // 2}), got {chunking.overlap}",
            param="chunking.overlap",
        )


def check_rerank(candidates: int, top_k: int) -> None:
    if not 1 <= candidates <= MAX_RERANK_DOCUMENTS:
        raise InvalidRequestError(
            f"rerank.candidates is 1 to {MAX_RERANK_DOCUMENTS:,}, got {candidates}", param="rerank.candidates"
        )
    if top_k > candidates:
        raise InvalidRequestError(
            f"top_k ({top_k}) is above rerank.candidates ({candidates}): the reranker orders only the candidates",
            param="top_k",
        )


def retrieval_scores(hit: Hit) -> dict[str, float]:
    """A reranked hit's scores before the rerank: each list's (hybrid) or the mode's own, as `retrieval`."""
    return hit.scores if hit.scores is not None else {"retrieval": hit.score}


def check_lexical(collection: Collection, store: VectorStore) -> None:
    """A lexical or hybrid search needs the collection's terms indexed by this gateway's analyzer."""
    if not store.lexical:
        raise LexicalSearchUnavailableError(store.name)
    if collection.lexical != ANALYZER:
        raise ConflictError(
            f"collection {collection.name!r} has no lexical index of this gateway's analyzer ({ANALYZER}); "
            f"it was written before lexical search or by another version. POST "
            f"/v1/collections/{collection.name}/reindex builds it (dense search works meanwhile)",
            code="lexical_index_missing",
            param="mode",
        )


def check_writable(collection: Collection) -> None:
    """409 while a re-index job holds the collection (its vectors are of two revisions until it ends)."""
    if collection.reindex_task is not None:
        raise ConflictError(
            f"collection {collection.name!r} is being re-indexed by task {collection.reindex_task}; it answers "
            f"again when the task completes (GET /v1/collections/{collection.name}/reindex/"
            f"{collection.reindex_task}; if it failed, POST /v1/collections/{collection.name}/reindex again)",
            code="collection_reindexing",
            param="name",
        )


def check_revision(collection: Collection, served: ModelInfo) -> None:
    check_writable(collection)
    if (collection.model, collection.model_revision) != (served.name, served.revision):
        raise ConflictError(
            f"collection {collection.name!r} holds vectors of {collection.model} revision "
            f"{collection.model_revision}, but {served.name} revision {served.revision} is served: re-index the "
            f"collection with POST /v1/collections/{collection.name}/reindex before using it",
            code="collection_needs_reindex",
            param="name",
        )
