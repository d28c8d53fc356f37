"""The semantic prompt cache: find an earlier request whose last user message says the same thing.

- `context`: which requests are comparable (same context: everything but the last
  user text, plus that text's numbers and polarity) and what is compared (that text).
- `simhash`: character n-grams: their 64-bit SimHash and the cosine of their counts.
- `matchers`: fingerprints and their similarity, by embedding (`EmbeddingMatcher`, fed by
  a `TextEmbedder` given at wiring) or by n-gram cosine, pruned by SimHash (`SimHashMatcher`).
- `stores`: the entries per context, in process (`MemorySemanticStore`) or in Redis
  (`RedisSemanticStore`), and their byte framing.
- `index`: `SemanticIndex`, which finds the exact-cache key of the most similar earlier question.
"""

from __future__ import annotations

from gateway.cache.semantic.context import query_negated, query_numbers, semantic_context_key, semantic_query
from gateway.cache.semantic.index import SemanticHit, SemanticIndex
from gateway.cache.semantic.matchers import EmbeddingMatcher, Matcher, SimHashMatcher, TextEmbedder
from gateway.cache.semantic.simhash import simhash64, simhash_similarity
from gateway.cache.semantic.stores import (
    REDIS_PREFIX,
    MemorySemanticStore,
    RedisSemanticStore,
    SemanticEntry,
    SemanticStore,
    decode_entry,
    encode_entry,
)

__all__ = [
    "REDIS_PREFIX",
    "EmbeddingMatcher",
    "Matcher",
    "MemorySemanticStore",
    "RedisSemanticStore",
    "SemanticEntry",
    "SemanticHit",
    "SemanticIndex",
    "SemanticStore",
    "SimHashMatcher",
    "TextEmbedder",
    "decode_entry",
    "encode_entry",
    "query_negated",
    "query_numbers",
    "semantic_context_key",
    "semantic_query",
    "simhash64",
    "simhash_similarity",
]
