"""Answering a search: the mode's hits (dense, lexical or both fused), a chunked collection's documents each once
and whole, and the reranker's order where the search asks for it. `SearchService.search` checks the request and
the collection first."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

from gateway.errors import ConflictError, InvalidRequestError
from gateway.search.analyzer import ANALYZER
from gateway.search.documents import Collection, Hit
from gateway.search.filters import Filter
from gateway.search.fusion import Fusion, fuse
from gateway.search.store import LexicalSearchUnavailableError, VectorStore
from gateway.services.embeddings import EmbeddingResult, EmbeddingService
from gateway.services.rerank import MAX_DOCUMENTS as MAX_RERANK_DOCUMENTS
from gateway.services.rerank import RERANKER_ALIAS, RerankResult, RerankService
from gateway.services.search_chunks import ChunkedDocuments
from gateway.services.search_terms import query_terms
from gateway.upstreams.triton_reranker import RerankerNotServedError
from gateway.usage.record import Usage

SEARCH_MODES = ("dense", "lexical", "hybrid")
# A search that answers `depth` points, and what makes `top_k` documents of it.
PointSearch = Callable[[int], Awaitable[list[Hit]]]
Finder = Callable[[PointSearch, int], Awaitable[list[Hit]]]
ScoreType = Literal["cosine", "bm25", "rrf", "weighted", "relevance"]
RERANK_CANDIDATES = 50  # hits of the search's mode the reranker scores when a search asks for a rerank


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


class SearchQueries:
    """`chunks` None: chunked collections cannot be searched (a service built without them: tests)."""

    def __init__(
        self,
        store: VectorStore,
        embeddings: EmbeddingService,
        reranker: RerankService | None,
        chunks: ChunkedDocuments | None,
    ) -> None:
        self._store = store
        self._embeddings = embeddings
        self._reranker = reranker
        self._chunked = chunks

    async def answer(
        self,
        collection: Collection,
        query: str,
        *,
        top_k: int,
        where: Filter | None,
        min_score: float | None,
        mode: str,
        fusion: Fusion | None,
        rerank_candidates: int | None,
        use_cache: bool,
    ) -> SearchResult:
        """The request checked already (`check_mode`, `check_rerank`); the collection's lexical index is checked
        here."""
        if mode != "dense":
            await check_lexical(collection, self._store)
        if rerank_candidates is not None:
            self._served_reranker.admit(rerank_candidates)
        depth, kept = (top_k, min_score) if rerank_candidates is None else (rerank_candidates, None)
        result = await self._retrieve(collection, query, mode, fusion, depth, where, kept, use_cache)
        if rerank_candidates is None:
            return result
        hits, reranked = await self._rerank(query, result.hits, top_k, min_score)
        return dataclasses.replace(result, hits=hits, score_type="relevance", reranked=reranked)

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
        terms = await query_terms(query) if mode != "dense" else ""  # once: a chunked search may ask again, deeper

        def lexical(floor: float | None) -> Callable[[int], Awaitable[list[Hit]]]:
            return partial(self._lexical, name, terms, where=where, min_score=floor)

        async def dense(depth: int, floor: float | None) -> tuple[EmbeddingResult, list[Hit]]:
            result = await self._embeddings.embed(
                [query],
                use_cache=use_cache,
                input_type="query",
                instruction=collection.query_instruction,
                gpu_work=None,  # a search query is never bulk work
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

    @property
    def _chunks(self) -> ChunkedDocuments:
        if self._chunked is None:
            raise RuntimeError("a chunked collection is searched by a service built without chunked documents")
        return self._chunked

    @property
    def _served_reranker(self) -> RerankService:
        if self._reranker is None:
            raise RerankerNotServedError(RERANKER_ALIAS)
        return self._reranker

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
        if not hits:
            return [], None
        # a chunked collection's document is judged by the chunk that found it: what fits the reranker's length
        texts = [h.text if h.chunk is None else h.chunk.text for h in hits]
        ranked = await self._served_reranker.rerank(query, texts, top_n=top_k)
        reranked = [
            dataclasses.replace(hits[r.index], score=r.relevance_score, scores=retrieval_scores(hits[r.index]))
            for r in ranked.results
        ]
        return [h for h in reranked if min_score is None or h.score >= min_score], ranked

    async def _lexical(
        self, name: str, terms: str, top_k: int, where: Filter | None, min_score: float | None
    ) -> list[Hit]:
        return await self._store.lexical_search(name, terms, top_k, where, min_score) if terms else []


def check_mode(mode: str, fusion: Fusion | None) -> None:
    if mode not in SEARCH_MODES:
        raise InvalidRequestError(f"mode is one of {', '.join(SEARCH_MODES)}; got {mode!r}", param="mode")
    if fusion is not None and mode != "hybrid":
        raise InvalidRequestError(f"fusion applies to mode hybrid, not {mode}", param="fusion")


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


async def check_lexical(collection: Collection, store: VectorStore) -> None:
    """A lexical or hybrid search needs the collection's terms indexed by this gateway's analyzer."""
    if not await store.lexical(collection.name):
        raise LexicalSearchUnavailableError(store.name)
    if collection.lexical != ANALYZER:
        raise ConflictError(
            f"collection {collection.name!r} has no lexical index of this gateway's analyzer ({ANALYZER}); "
            f"it was written before lexical search or by another version. POST "
            f"/v1/collections/{collection.name}/reindex builds it (dense search works meanwhile)",
            code="lexical_index_missing",
            param="mode",
        )
