"""Chat: the upstream client, the exact and semantic answer caches and the account's shared quota."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from gateway.cache.chat import ExactChatCache, TtlPolicy
from gateway.cache.semantic import (
    EmbeddingMatcher,
    Matcher,
    MemorySemanticStore,
    RedisSemanticStore,
    SemanticIndex,
    SemanticStore,
    SimHashMatcher,
    TextEmbedder,
)
from gateway.cache.stores import build_store
from gateway.quota import QuotaConfig, build_limiter
from gateway.redis_client import RedisConnection
from gateway.services.chat import ChatService
from gateway.settings import CacheSettings, ChatSettings, LimitSettings, SemanticCacheSettings
from gateway.upstreams.breaker import BreakerBoard
from gateway.upstreams.chat import ChatClient

# The Redis keys of the chat quota keep their name from before 0.2 (`quota:{hunyuan}:*`), so that the replicas
# of both releases share the account's quota during a rolling upgrade.
CHAT_QUOTA_KEYS = "hunyuan"


@asynccontextmanager
async def chat_service(
    config: ChatSettings,
    cache: CacheSettings,
    semantic: SemanticCacheSettings,
    limits: LimitSettings,
    embeddings: TextEmbedder,
    redis: RedisConnection | None,
) -> AsyncIterator[ChatService]:
    """The chat service with its pooled upstream client, answer caches and shared quota."""
    async with AsyncExitStack() as stack:
        upstream = await stack.enter_async_context(ChatClient(config))
        answers = None
        if redis is not None or cache.chat_cache_mb > 0:
            ttl = TtlPolicy(
                cache.chat_cache_ttl_base_seconds,
                cache.chat_cache_ttl_per_char_seconds,
                cache.chat_cache_ttl_max_seconds,
            )
            answers = ExactChatCache(build_store(redis, memory_mb=cache.chat_cache_mb), ttl)
            stack.push_async_callback(answers.aclose)
        index = semantic_index(semantic, embeddings, redis)
        if index is not None:
            stack.push_async_callback(index.aclose)
        quota = build_limiter(QuotaConfig(**config.quota.model_dump()), redis, name="chat", key_name=CHAT_QUOTA_KEYS)
        stack.push_async_callback(quota.aclose)
        yield ChatService(
            upstream,
            answers,
            index,
            quota,
            BreakerBoard(config.breaker_failures, config.breaker_reset_seconds),
            config.fallbacks(),
            max_prompt_chars=limits.max_prompt_chars,
            timeout_seconds=config.total_timeout_seconds,
        )


def semantic_index(
    config: SemanticCacheSettings, embedder: TextEmbedder, redis: RedisConnection | None
) -> SemanticIndex | None:
    """The semantic index `config` asks for, or None; an embedding matcher gets its vectors from `embedder` (the
    embedding service), so the cache never reaches into the services."""
    if config.matcher == "off":
        return None
    matcher: Matcher = SimHashMatcher() if config.matcher == "simhash" else EmbeddingMatcher(embedder)
    store: SemanticStore = RedisSemanticStore(redis) if redis is not None else MemorySemanticStore()
    return SemanticIndex(store, matcher, config.threshold, max_entries_per_context=config.max_entries_per_context)
