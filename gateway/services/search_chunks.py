"""The documents of a chunked collection (`gateway.search.chunks` says how they are stored): written as the chunks
Triton's chunker draws, each embedded and analyzed alone; read, deleted and found as whole documents.

A document's chunks are written first and its chunks beyond the new count deleted after, so that a failure in
between leaves the old or the new version findable, never none. Deleting by filter deletes the chunks after the
first ones and then the first ones, which count the documents: a failure in between leaves first chunks that a
retry deletes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Protocol

from gateway.errors import InvalidRequestError
from gateway.search import chunks
from gateway.search.documents import Chunking, Document, Hit, Metadata
from gateway.search.filters import All, Compare, Filter
from gateway.search.store import DocumentWrite, VectorStore
from gateway.services.embeddings import EmbeddingService
from gateway.services.search_terms import terms_beside
from gateway.upstreams.triton_chunker import ChunkerNotServedError

MAX_DEPTH = 1000  # chunks a search reads at most to find top_k distinct documents
WIDEN = 4  # each try reads this many times more chunks than the one before


class Chunker(Protocol):
    async def chunk(self, text: str, max_tokens: int, overlap: int) -> list[tuple[int, int]]: ...


class NewDocumentLike(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def text(self) -> str: ...

    @property
    def metadata(self) -> Metadata: ...


class ChunkedDocuments:
    def __init__(
        self, store: VectorStore, embeddings: EmbeddingService, chunker: Chunker | None, chunker_model: str
    ) -> None:
        self._store = store
        self._embeddings = embeddings
        self._chunker = chunker
        self._chunker_model = chunker_model

    async def upsert(
        self, name: str, chunking: Chunking, documents: Sequence[NewDocumentLike], now: int, *, use_cache: bool = True
    ) -> tuple[int, str]:
        """Write each document as its chunks; answers the embedding tokens and the model."""
        if self._chunker is None:
            raise ChunkerNotServedError(self._chunker_model)
        chunker = self._chunker
        spans = await asyncio.gather(*(chunker.chunk(d.text, chunking.max_tokens, chunking.overlap) for d in documents))
        made = [
            chunks.points(d.id, d.text, d.metadata, [chunks.Span(start, end) for start, end in drawn])
            for d, drawn in zip(documents, spans, strict=True)
        ]
        flat = [point for points in made for point in points]
        texts = [point.text for point in flat]
        terms, embedded = await terms_beside(
            texts, self._embeddings.embed(texts, use_cache=use_cache, gpu_work="upsert")
        )
        before = await self._counts(name, [d.id for d in documents])
        writes = [
            DocumentWrite(p.id, p.text, p.metadata, vector, t)
            for p, vector, t in zip(flat, embedded.vectors, terms, strict=True)
        ]
        await self._store.upsert(name, writes, now)
        stale = [
            chunks.point_id(d.id, index)
            for d, points in zip(documents, made, strict=True)
            for index in range(len(points), before.get(d.id, 0))
        ]
        if stale:
            await self._store.delete_documents(name, stale)
        return embedded.prompt_tokens, embedded.model

    async def get(self, name: str, ids: Sequence[str]) -> list[Document]:
        """The documents that exist among `ids`, each put back together from its chunks."""
        counts = await self._counts(name, ids)
        rest = [chunks.point_id(i, index) for i, count in counts.items() for index in range(1, count)]
        read = await self._store.get_documents(name, [chunks.point_id(i, 0) for i in counts] + rest)
        by_document: dict[str, list[Document]] = {}
        for chunk in read:
            by_document.setdefault(str(chunk.metadata[chunks.DOCUMENT]), []).append(chunk)
        return [chunks.whole(parts) for parts in by_document.values()]

    async def delete(self, name: str, ids: Sequence[str]) -> int:
        counts = await self._counts(name, ids)
        every = [point for i, count in counts.items() for point in chunks.chunk_ids(i, count)]
        if every:
            await self._store.delete_documents(name, every)
        return len(counts)

    async def delete_matching(self, name: str, where: Filter) -> int:
        await self._store.delete_matching(name, All((where, Compare(chunks.INDEX, "$gt", 0))))
        return await self._store.delete_matching(name, All((where, chunks.FIRST)))

    async def found(self, search: Callable[[int], Awaitable[list[Hit]]], top_k: int) -> list[Hit]:
        """The best `top_k` documents by their best chunk: `search(depth)` answers that many chunks, best first,
        and is asked again for more while the chunks read hold fewer than `top_k` documents."""
        depth = min(max(top_k * WIDEN, 40), MAX_DEPTH)
        while True:
            hits = await search(depth)
            documents = chunks.best_per_document(hits)
            if len(documents) >= top_k or len(hits) < depth or depth >= MAX_DEPTH:
                return documents[:top_k]
            depth = min(depth * WIDEN, MAX_DEPTH)

    async def with_texts(self, name: str, hits: list[Hit]) -> list[Hit]:
        """Each hit with its whole document's text (a hit of a document deleted meanwhile is left out)."""
        texts = {document.id: document.text for document in await self.get(name, [h.id for h in hits])}
        return [replace(hit, text=texts[hit.id]) for hit in hits if hit.id in texts]

    async def _counts(self, name: str, ids: Sequence[str]) -> dict[str, int]:
        """How many chunks each stored document among `ids` has (read off its first chunk)."""
        firsts = await self._store.get_documents(name, [chunks.point_id(i, 0) for i in ids])
        return {str(f.metadata[chunks.DOCUMENT]): int(str(f.metadata[chunks.COUNT])) for f in firsts}


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
