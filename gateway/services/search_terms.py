"""Terms for the lexical index: documents' made beside their embedding, a query's made once per search."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

from gateway.search.analyzer import analyze, analyze_many
from gateway.services.embeddings import EmbeddingResult

# Below this many characters the terms are made on the loop (well under a millisecond for a batch of short
# documents): a worker thread's hand-over and the task to overlap it cost more than they save there.
INLINE_CHARS = 8_000


async def terms_beside(
    texts: Sequence[str], embedding: Awaitable[EmbeddingResult]
) -> tuple[list[str], EmbeddingResult]:
    """The texts' terms, and `embedding` awaited; a long batch is analyzed on a worker thread while Triton embeds."""
    if sum(len(text) for text in texts) <= INLINE_CHARS:
        return analyze_many(texts), await embedding
    terms, result = await asyncio.gather(asyncio.to_thread(analyze_many, texts), embedding)
    return terms, result


async def query_terms(query: str) -> str:
    """A query's terms; a long query (up to the longest text a request may send) analyzed on a worker thread."""
    return analyze(query) if len(query) <= INLINE_CHARS else await asyncio.to_thread(analyze, query)
