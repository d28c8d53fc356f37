"""The semantic index: the exact key of the most similar earlier question in the same context.

Within a context (`context.semantic_context_key`, prefixed by the matcher's name), the
store keeps (fingerprint, exact key) pairs, newest first; a lookup returns the exact key
(`gateway.cache.chat.exact_key`) of the most similar earlier query at or above the
threshold, and the answer is then read from the exact cache. The cache only saves
work: a failing store or embedder is counted and the request goes on without it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, NamedTuple

from gateway import metrics
from gateway.cache.base import CacheStoreError
from gateway.cache.semantic.context import semantic_context_key, semantic_query
from gateway.cache.semantic.matchers import Matcher
from gateway.cache.semantic.stores import SemanticEntry, SemanticStore
from gateway.errors import UpstreamUnavailableError

log = logging.getLogger(__name__)

CACHE_NAME = "chat_semantic"
RECENT_FINGERPRINTS = 256  # lookup's fingerprint is reused by the add() that follows a miss


class SemanticHit(NamedTuple):
    answer_key: str  # the exact-cache key of the earlier request
    similarity: float


class SemanticIndex:
    """Finds the exact key of the most similar earlier query in the same context; never raises for a failing part."""

    def __init__(
        self,
        store: SemanticStore,
        matcher: Matcher,
        threshold: float,
        *,
        max_entries_per_context: int = 500,
        ttl_seconds: int = 86400,
    ) -> None:
        if not -1.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [-1, 1], got {threshold}")
        if max_entries_per_context < 1:
            raise ValueError(f"max_entries_per_context must be >= 1, got {max_entries_per_context}")
        if ttl_seconds < 1:
            raise ValueError(f"ttl_seconds must be >= 1, got {ttl_seconds}")
        self.store = store
        self.matcher = matcher
        self.threshold = threshold
        self.max_entries_per_context = max_entries_per_context
        self.ttl_seconds = ttl_seconds
        self._recent: OrderedDict[str, bytes] = OrderedDict()

    async def lookup(self, body: dict[str, Any]) -> SemanticHit | None:
        """The best earlier match at or above the threshold (the newest among equals), or None."""
        query = semantic_query(body)
        if query is None or not self.matcher.comparable(query):
            return None
        entries = await self._entries(self.context(body), "get")
        if entries is None:
            return None
        best = await self._best(query, entries) if entries else None  # an empty context needs no embedding
        metrics.CACHE_LOOKUPS.labels(cache=CACHE_NAME, result="hit" if best else "miss").inc()
        return best

    async def add(self, body: dict[str, Any], answer_key: str) -> None:
        """Index `body`'s last user message as answered under `answer_key` (once per context and text)."""
        query = semantic_query(body)
        if query is None or not self.matcher.comparable(query):
            return
        context = self.context(body)
        entries = await self._entries(context, "set")
        # Same context and same text means the same exact key, so the key identifies the text.
        if entries is None or any(entry.answer_key == answer_key for entry in entries):
            return
        fingerprint = await self._fingerprint(query)
        if fingerprint is None:
            return
        entry = SemanticEntry(fingerprint, answer_key)
        try:
            await self.store.add(context, entry, max_entries=self.max_entries_per_context, ttl_seconds=self.ttl_seconds)
        except CacheStoreError as exc:
            self._failed("set", exc, logging.DEBUG)

    async def aclose(self) -> None:
        await self.store.aclose()

    def context(self, body: dict[str, Any]) -> str:
        """The store context of `body`: the matcher and everything but the last user text."""
        return f"{self.matcher.name}:{semantic_context_key(body)}"

    async def _entries(self, context: str, operation: str) -> list[SemanticEntry] | None:
        try:
            return await self.store.entries(context)
        except CacheStoreError as exc:
            self._failed(operation, exc, logging.DEBUG)
            return None

    async def _best(self, query: str, entries: list[SemanticEntry]) -> SemanticHit | None:
        fingerprint = await self._fingerprint(query)
        if fingerprint is None:
            return None
        best: SemanticHit | None = None
        for entry in entries:
            similarity = self.matcher.similarity(fingerprint, entry.fingerprint)
            if similarity >= self.threshold and (best is None or similarity > best.similarity):
                best = SemanticHit(entry.answer_key, similarity)
        return best

    async def _fingerprint(self, query: str) -> bytes | None:
        known = self._recent.get(query)
        if known is not None:
            self._recent.move_to_end(query)
            return known
        try:
            (fingerprint,) = await self.matcher.fingerprints([query])
        except UpstreamUnavailableError as exc:  # an outage its client logs once, not once per chat request
            self._failed("fingerprint", exc, logging.DEBUG)
            return None
        except Exception as exc:  # the embedder's own errors: the request must go on without the cache
            self._failed("fingerprint", exc)
            return None
        self._recent[query] = fingerprint
        if len(self._recent) > RECENT_FINGERPRINTS:
            self._recent.popitem(last=False)
        return fingerprint

    @staticmethod
    def _failed(operation: str, exc: Exception, level: int = logging.WARNING) -> None:
        """Counted always; a store failure is logged at DEBUG (its Redis circuit logs the outage once)."""
        metrics.CACHE_ERRORS.labels(cache=CACHE_NAME, operation=operation).inc()
        log.log(level, "semantic cache %s failed: %s", operation, exc)
