"""Where state lives: Redis, the caches, the video task store and search's vector store."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class RedisSettings(BaseSettings):
    """Redis, shared by all replicas: the caches, the upstream quotas and the video task records."""

    model_config = SettingsConfigDict(env_prefix="REDIS_", frozen=True)

    url: SecretStr | None = Field(
        None,
        description="Redis URL (may hold a password). Unset: caches in process memory, quotas per replica, video "
        "tasks in SQLite (one replica).",
    )
    timeout_seconds: float = Field(
        0.25,
        description="Socket timeout of every Redis call; a slow Redis degrades to cache misses and local quotas, "
        "never to slow answers.",
    )
    backoff_seconds: float = Field(
        1.0,
        gt=0,
        description="After a Redis timeout or connection error, Redis is skipped (caches miss, quotas limit each "
        "replica alone, video tasks answer 503) for this long, then one PING probes it in the background. Shorter: "
        "a recovered Redis is used sooner; longer: fewer probes to a Redis that is still down.",
    )

    def url_value(self) -> str | None:
        return self.url.get_secret_value() if self.url is not None else None


class CacheSettings(BaseSettings):
    """The embedding cache and the exact chat answer cache (in Redis when REDIS_URL is set)."""

    model_config = SettingsConfigDict(frozen=True, populate_by_name=True)

    embedding_cache_mb: float = Field(
        256.0,
        validation_alias="EMBEDDING_CACHE_MB",
        description="Bound of the in-process embedding cache (least recently used entries go first); 0 disables it.",
    )
    embedding_cache_ttl_seconds: int = Field(
        7 * 24 * 3600,
        validation_alias="EMBEDDING_CACHE_TTL_SECONDS",
        description="Lifetime of a vector in Redis. Keys carry the model revision, so this only bounds memory.",
    )
    chat_cache_mb: float = Field(
        64.0,
        validation_alias="CHAT_CACHE_MB",
        description="Bound of the in-process chat answer cache (without REDIS_URL); 0 disables the exact cache.",
    )
    chat_cache_ttl_base_seconds: int = Field(
        3600, validation_alias="CHAT_CACHE_TTL_BASE_SECONDS", description="Lifetime of a cached chat answer..."
    )
    chat_cache_ttl_per_char_seconds: int = Field(
        10, validation_alias="CHAT_CACHE_TTL_PER_CHAR_SECONDS", description="...plus this per prompt character..."
    )
    chat_cache_ttl_max_seconds: int = Field(
        24 * 3600, validation_alias="CHAT_CACHE_TTL_MAX_SECONDS", description="...up to this."
    )


class TaskStoreSettings(BaseSettings):
    """Where video task records live: SQLite on disk (one replica) or, with REDIS_URL, Redis (all replicas). The
    retention, lease and scan interval apply to search re-index tasks too (kept beside SEARCH_PATH, or in Redis)."""

    model_config = SettingsConfigDict(env_prefix="TASKS_", frozen=True)

    sqlite_path: str = Field(
        ".run/tasks.sqlite3", description="Task database without REDIS_URL; keep it on a persistent volume."
    )
    retention_seconds: float = Field(
        24 * 3600.0, description="How long a finished task stays readable; after it, GET answers 404."
    )
    lease_seconds: float = Field(
        30.0,
        description="A replica's claim on submitting or polling a task (renewed while a submit call runs); if the "
        "replica dies another one takes the task over after this.",
    )
    scan_interval_seconds: float = Field(
        1.0, description="How often each replica looks for tasks to submit, poll, time out or expire."
    )


class SearchSettings(BaseSettings):
    """Semantic search: where collections live. Embedded on local disk by default, Milvus at scale."""

    model_config = SettingsConfigDict(env_prefix="SEARCH_", frozen=True)

    enabled: bool = Field(
        True,
        description="Serve semantic search (/v1/collections, gRPC Search). false: no store is opened, those answer "
        "503 `search_disabled` (gRPC UNAVAILABLE) and /readyz reports search `disabled`.",
    )
    path: str = Field(
        ".run/search/",
        description="Folder of the embedded vector store (Qdrant Edge, in this process) when SEARCH_MILVUS_URI is "
        "unset; keep it on a persistent volume. One process owns it: run one replica, or use Milvus. A folder that "
        "cannot be made or read leaves the gateway up and search alone degraded (503 `search_store_unavailable`).",
    )
    milvus_uri: str | None = Field(
        None,
        description="Milvus server (e.g. http://milvus:19530): collections live there and every replica shares "
        "them. Unset: the embedded store under SEARCH_PATH.",
    )
    milvus_token: SecretStr | None = Field(None, description="Milvus token (user:password or an API key).")
    milvus_index: Literal["HNSW", "AUTOINDEX"] = Field(
        "HNSW",
        description="Milvus: the vector index of the collections made from now on. HNSW (M 16, efConstruction 100, "
        "searched with SEARCH_HNSW_EF); AUTOINDEX: the server's own choice, what Zilliz Cloud and Milvus Lite accept.",
    )
    hnsw_ef: int = Field(
        128,
        ge=1,
        le=4096,
        description="How many candidates a dense search keeps while it walks the HNSW graph (ef), in both stores: "
        "more finds more of the exact nearest neighbours for more CPU. The embedded store searches with a filter at "
        "200 or more. 128 kept 0.99 of the exact top 10 at 100,000 documents; at a million one build needed 200 "
        "(docs/operations.md).",
    )
    timeout_seconds: float = Field(
        10.0, description="Deadline of one Milvus call; past it search answers 503 instead of piling up requests."
    )
    max_threads: int = Field(
        4,
        description="Threads that run the store's (synchronous) calls, so they never block the event loop. More "
        "lets more searches run at once; on few cores they only queue for the CPU there instead of here.",
    )
    milvus_flush_after_rows: int = Field(
        1000,
        ge=0,
        description="Milvus: rows written to a collection (by this replica) since its last flush that make it flushed "
        "once writes to it go quiet, so they are searched through the HNSW index rather than the lower-recall "
        "interim index of growing segments. Each flush seals a segment and builds its index; 0: never flush.",
    )
    milvus_flush_quiet_seconds: float = Field(
        5.0,
        gt=0,
        description="Milvus: seconds without a write to a collection before its flush (see "
        "SEARCH_MILVUS_FLUSH_AFTER_ROWS): a bulk ingest of many requests is flushed once, at its end.",
    )
