"""Configuration from the environment: one settings class per concern.

No other module reads `os.environ`. Every field states its unit and trade-off;
the Helm chart's values map 1:1 to these variables.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from pydantic import Field, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.usage.pricing import ModelPrice


class ServerSettings(BaseSettings):
    """Where the gateway listens, how it shuts down, and the URL at which upstreams reach it."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", frozen=True)

    host: str = Field("0.0.0.0", description="Address both servers bind to.")
    http_port: int = Field(8080, description="REST (FastAPI) port.")
    grpc_port: int = Field(50051, description="gRPC port (package gateway.v1).")
    shutdown_grace_seconds: float = Field(
        20.0,
        description="On SIGTERM, seconds in-flight requests get to finish before they are cut off. The clients "
        "then get 15 s to close; a close still waiting after that is abandoned (logged) and the process exits.",
    )
    header_timeout_seconds: float = Field(
        15.0,
        description="A connection that does not complete a request's headers this long after it opened or its "
        "last response ended is closed (idle and slow-header connections would otherwise hold sockets for ever).",
    )
    keepalive_seconds: float = Field(
        75.0,
        description="An idle keep-alive HTTP connection is closed after this long (uvicorn's timeout_keep_alive). "
        "Keep it above the keep-alive of the proxy in front (nginx: 60 s), so that the proxy closes idle "
        "connections first: a request sent on a connection the gateway is closing gets 502 from the proxy.",
    )
    grpc_max_connection_age_seconds: float = Field(
        300.0,
        description="gRPC connections are told to reconnect (GOAWAY) after this long, so that clients with "
        "long-lived channels spread over replicas added since (0: never).",
    )
    grpc_max_connection_age_grace_seconds: float = Field(
        300.0,
        description="Calls in flight on an aged gRPC connection get this long to finish (a chat stream may "
        "last HUNYUAN_TOTAL_TIMEOUT_SECONDS) before it is closed.",
    )
    log_level: str = Field("INFO", description="Log level of the JSON logs.")
    public_url: str | None = Field(
        None,
        description="Base URL at which the upstreams reach this gateway (e.g. https://ai.example.com), used for "
        "webhook callbacks. Unset: no webhooks are requested and image tasks are polled from the start.",
    )


class TritonSettings(BaseSettings):
    """The Triton server that computes the embeddings, and how the gateway calls it."""

    model_config = SettingsConfigDict(env_prefix="TRITON_", frozen=True)

    url: str = Field(
        "127.0.0.1:8001",
        description="Triton's gRPC address: host:port or dns:///host:port (resolved by the gateway, IPv4 first), or "
        "ipv4:host:port,host:port. Calls go round robin over every address, one channel each: give a headless "
        "Service's name to spread them over all Triton pods. A call that finds its Triton stopping or gone is made "
        "once more on another within its deadline, and that Triton gets no calls until its model is ready again.",
    )
    model: str = Field("bge", description="Ensemble that maps TEXT to EMBEDDING.")
    timeout_seconds: float = Field(
        30.0, description="Deadline of one Triton call; longer waits fail with 504 instead of piling up."
    )
    ready_timeout_seconds: float = Field(1.0, description="Deadline of the readiness probe's call to Triton.")
    channel_max_age_seconds: float = Field(
        300.0,
        ge=0,
        description="How often the gateway resolves TRITON_URL again (a failed call resolves it at once, at most "
        "once a second), so that Triton pods added since (scale-out, a rollout) get their share of calls, and "
        "how old a channel gets before new calls go on a fresh one (behind a ClusterIP, a new connection may land "
        "on another pod); a replaced channel is closed once its calls end (none is cut). Lower: new pods are found "
        "sooner, one lookup and handshake more per interval; 0: resolved once, one channel per address for ever.",
    )
    max_in_flight_calls: int = Field(
        1,
        description="Triton calls this gateway keeps in flight. Requests arriving while all are busy are merged "
        "into the next call (up to the model's max batch size), and one call more goes as soon as as many texts "
        "wait as the running call carries, or when what is left of it is one text's encoding (timed from the "
        "calls the encoder served), so that the encoder need not wait for a round trip: fewer, larger calls "
        "under load, no added delay when quiet. Higher: more parallel calls, smaller batches; worth it where "
        "Triton has its own cores or GPU and the network round trip is to be hidden (the Helm chart sets 4). With "
        "Triton on the gateway's cores, 1 is best: the encoder gets the largest batches and no call competes with "
        "it for the cores.",
    )


class AuthSettings(BaseSettings):
    """Who may call the gateway."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", frozen=True)

    api_keys: SecretStr | None = Field(
        None,
        description="Comma-separated bearer keys, each an unnamed key of the team 'default' with every scope. With "
        "no key here or created through the admin API, and no GATEWAY_KEYS_FILE, every route but the admin API is "
        "open (a warning is logged at start).",
    )
    keys_file: str | None = Field(
        None,
        description="YAML file of named keys (team, scopes, expiry, limits; secrets as SHA-256) and team limits, "
        "e.g. mounted from a Secret. Checked for changes every GATEWAY_KEYS_REFRESH_SECONDS; a file that does not "
        "parse keeps the previous keys in force and the reason is logged.",
    )
    keys_refresh_seconds: float = Field(
        0.25,
        gt=0,
        description="How often each replica looks for changed keys (the keys file's mtime, the key store's version): "
        "a key created, changed or revoked anywhere is in force everywhere within this. Lower: one more "
        "cheap Redis GET per replica and interval.",
    )
    keys_sqlite_path: str = Field(
        ".run/keys.sqlite3",
        description="Keys created through the admin API without REDIS_URL (one replica); with REDIS_URL they are "
        "kept in Redis, shared by every replica.",
    )

    def keys(self) -> list[bytes]:
        if self.api_keys is None:
            return []
        return [k.strip().encode() for k in self.api_keys.get_secret_value().split(",") if k.strip()]


class UsageSettings(BaseSettings):
    """The usage record per key, model and day, and the prices that make its cost."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", frozen=True)

    prices: dict[str, ModelPrice] = Field(
        default_factory=dict,
        description='JSON price table by model: {"hy3-preview": {"input": 1.2, "output": 4.8, "cached": 0.3}, '
        '"bge": {"embedding": 0.02}, "fal-ai/pika/v2.2/text-to-video": {"video_second": 0.05}}; chat prices per '
        "1,000,000 tokens, embeddings per 1,000 tokens, videos per second, all in one currency. Models priced here "
        "get X-Request-Cost (gRPC: trailing metadata x-request-cost) and count against money budgets; the others "
        "cost 0.",
    )
    usage_sqlite_path: str = Field(
        ".run/usage.sqlite3",
        description="Usage records without REDIS_URL (one replica); with REDIS_URL they are kept in Redis.",
    )
    usage_spool_path: str = Field(
        ".run/usage-spool.sqlite3",
        description="With REDIS_URL: the local SQLite file (WAL) that keeps the usage records Redis did not take "
        "(an error, a timeout, an outage) until they are written to Redis when it answers again, also after a "
        "restart of a killed process; each request counts once however often it is replayed. In the chart: next "
        "to TASKS_SQLITE_PATH, on the gateway's task volume.",
    )
    usage_spool_max_records: int = Field(
        200_000,
        ge=1,
        description="Records the usage spool holds at most (a few hundred bytes each); past it, the records of "
        "the outage are dropped, counted in gateway_usage_spool_dropped_total and logged once.",
    )


class LimitSettings(BaseSettings):
    """Input limits, deadlines and load shedding, for REST and gRPC alike."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", frozen=True)

    max_texts_per_request: int = Field(
        2048, description="Texts in one embeddings request; larger batches are split for Triton anyway."
    )
    max_text_chars: int = Field(
        100_000, description="Characters per text; the model reads only its first max tokens of each text."
    )
    max_body_bytes: int = Field(8 * 1024 * 1024, description="Request body size; larger bodies get 413 unread.")
    request_timeout_seconds: float = Field(60.0, description="Whole-request deadline; past it the client gets 504.")
    max_prompt_chars: int = Field(
        200_000, description="Characters in a chat request's messages; longer prompts get 400 before any upstream call."
    )
    max_in_flight: int = Field(
        256,
        description="Requests and gRPC calls served at once (one budget). Above it, they are refused with 429 + "
        "Retry-After (gRPC: RESOURCE_EXHAUSTED) at once (load shedding) instead of queuing without bound.",
    )
    max_task_watchers: int = Field(
        1024,
        description="Image task event streams open at once (REST and gRPC), apart from GATEWAY_MAX_IN_FLIGHT: a "
        "watcher waits minutes at almost no cost. Above it, 429 + Retry-After; each holds a connection.",
    )


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


class HunyuanQuotaSettings(BaseSettings):
    """The chat account's quota, enforced across all replicas when REDIS_URL is set. TokenHub sets its limits per
    model and inference service and shows them on the model's page in its console; it publishes no account-wide
    figure, so the defaults are a conservative start (the retired Hunyuan platform's 20 QPS / 5 concurrent)."""

    model_config = SettingsConfigDict(env_prefix="HUNYUAN_", frozen=True)

    requests_per_second: float = Field(
        20.0,
        description="Calls per second to the account; set it to the model's limit in TokenHub's console (its RPM "
        "/ 60). Above the real limit the upstream answers 429; below it, requests wait here.",
    )
    max_concurrent: int = Field(
        5,
        description="Calls in flight at once, as TokenHub's console gives for the model; a reasoning answer holds "
        "its call for longer.",
    )
    tokens_per_minute: int | None = Field(
        None,
        description="Token budget per minute (TokenHub's TPM), prompt and answer, reasoning included: each call "
        "reserves an estimate and is settled with the usage it reports. Unset: not limited.",
    )
    max_wait_seconds: float = Field(
        10.0, description="How long a request may wait for a quota slot before it gets 429 with Retry-After."
    )
    rate_margin_seconds: float = Field(
        0.05,
        description="Calls are spaced (1 s + margin) / rate apart: the upstream counts arrivals, which network "
        "jitter bunches; costs the margin's share of the rate.",
    )
    lease_seconds: float = Field(
        120.0, description="A concurrency slot held by a crashed replica frees itself after this (live calls renew)."
    )


class HunyuanSettings(BaseSettings):
    """Tencent HY (Hunyuan) chat through Tencent TokenHub's OpenAI-compatible API, and the account's quota."""

    model_config = SettingsConfigDict(env_prefix="HUNYUAN_", frozen=True)

    base_url: str = Field(
        "https://tokenhub.tencentmaas.com/v1",
        description="OpenAI-compatible base URL: Tencent TokenHub (mainland); international accounts use "
        "https://tokenhub-intl.tencentcloudmaas.com/v1. The old Hunyuan endpoint was retired on 2026-09-30.",
    )
    backup_base_urls: str = Field(
        "",
        description="Comma-separated base URLs tried in order when the one before cannot be reached or answers 5xx "
        "before its first byte (each host has its own circuit breaker; the account's quota is shared by all), e.g. "
        "TokenHub's documented backup 'https://tokenhub-intl.tencentcloudmaas.tech/v1'. Empty: no failover.",
    )
    api_key: SecretStr | None = Field(
        None, description="TokenHub API key (from TokenHub's console); unset: chat answers 503 naming this variable."
    )
    connect_timeout_seconds: float = Field(5.0, description="TCP/TLS connect deadline per attempt.")
    first_byte_timeout_seconds: float = Field(
        60.0,
        description="Wait for the response headers, and between streamed chunks (idle time, not answer length).",
    )
    total_timeout_seconds: float = Field(
        300.0, description="Whole call, retries included; past it the client gets 504."
    )
    max_retries: int = Field(
        2,
        description="Retries on connection errors, 429 and 5xx before the first byte; never after it.",
    )
    retry_base_seconds: float = Field(
        0.25, description="First back-off; doubles per retry, with jitter, or Retry-After."
    )
    max_connections: int = Field(100, description="Pooled connections to the upstream (keep-alive).")
    fallback_models: str = Field(
        "",
        description="Comma-separated 'model=fallback' pairs tried when the first choice's breaker is open or it fails "
        "before the first byte, e.g. 'hy3-preview=deepseek-v4-flash'.",
    )
    models: str = Field(
        "hy3-preview",
        description="Comma-separated chat models that GET /v1/models lists (with the models named in "
        "HUNYUAN_FALLBACK_MODELS) when the upstream cannot be asked: no key, an error, or an empty list.",
    )
    breaker_failures: int = Field(
        5, description="Consecutive failures that open a model's (or a host's) circuit breaker."
    )
    breaker_reset_seconds: float = Field(
        30.0, description="How long an open breaker answers 503 (a host's: is skipped) before one probe call."
    )
    quota: HunyuanQuotaSettings = Field(default_factory=HunyuanQuotaSettings)

    def fallbacks(self) -> dict[str, list[str]]:
        chains: dict[str, list[str]] = {}
        for pair in filter(None, (p.strip() for p in self.fallback_models.split(","))):
            model, _, fallback = pair.partition("=")
            chains.setdefault(model.strip(), []).append(fallback.strip())
        return chains

    def base_urls(self) -> list[str]:
        """HUNYUAN_BASE_URL, then HUNYUAN_BACKUP_BASE_URLS, each once, in order of preference."""
        backups = (url.strip() for url in self.backup_base_urls.split(","))
        return list(dict.fromkeys(url.rstrip("/") for url in (self.base_url.strip(), *backups) if url))

    def configured_models(self) -> list[str]:
        """HUNYUAN_MODELS, then every model HUNYUAN_FALLBACK_MODELS names, each once, in order."""
        named = [m.strip() for m in self.models.split(",")]
        for model, fallbacks in self.fallbacks().items():
            named += [model, *fallbacks]
        return list(dict.fromkeys(m for m in named if m))


class SemanticCacheSettings(BaseSettings):
    """The semantic prompt cache: a paraphrase of an earlier question gets its answer."""

    model_config = SettingsConfigDict(env_prefix="CHAT_SEMANTIC_", frozen=True)

    matcher: Literal["off", "embedding", "simhash"] = Field(
        "simhash",
        description="'embedding': cosine of the stack's own embeddings; 'simhash' (default: fewest false hits on the "
        "default model, `make eval-cache`): cosine of character 3-gram counts, pruned by SimHash.",
    )
    threshold: float = Field(
        0.94,
        description="Similarity at or above which a cached answer is served. Lower: more hits and more wrong "
        "answers; `make eval-cache` measures both (0.94: false hits 0.5 % of the simhash matcher's hits).",
    )
    max_entries_per_context: int = Field(200, description="Questions remembered per model, parameters and history.")


class VideoSettings(BaseSettings):
    """Pika video generation through fal.ai's queue API, run as asynchronous tasks."""

    model_config = SettingsConfigDict(env_prefix="PIKA_", frozen=True)

    base_url: str = Field("https://queue.fal.run", description="fal queue base URL.")
    api_key: SecretStr | None = Field(
        None, description="fal API key (sent as 'Authorization: Key ...'); unset: video routes answer 503 naming it."
    )
    model_path: str = Field("fal-ai/pika/v2.2/text-to-video", description="fal app and endpoint to submit to.")
    webhook_jwks_url: str = Field(
        "https://rest.alpha.fal.ai/.well-known/jwks.json",
        description="JWKS with the Ed25519 keys that sign fal webhooks; cached, refetched on an unknown key.",
    )
    webhook_tolerance_seconds: float = Field(
        300.0, description="Webhooks whose timestamp is further off than this are refused (replay protection)."
    )
    webhook_jwks_timeout_seconds: float = Field(
        2.0,
        gt=0,
        description="Deadline of a whole JWKS fetch (only webhooks with their URL token cause one); a webhook "
        "waits for it, and gets 503 (fal retries) when it passes.",
    )
    unknown_submit_wait_seconds: float = Field(
        60.0,
        ge=0,
        description="How long a task whose submit call was cut off (the gateway died during it, or it timed out) "
        "waits for its job to show itself, by its webhook (GATEWAY_PUBLIC_URL) or in fal's request history "
        "(PIKA_PLATFORM_URL), before it is submitted again; the job is then adopted. fal lists a job only once "
        "it has ended, so without webhooks this should cover most jobs' run (about the p95 of "
        "gateway_image_task_duration_seconds); a job that ends later is paid twice, and a submit that never "
        "reached fal waits this long once. The default leaves half of PIKA_TASK_TIMEOUT_SECONDS for the new "
        "attempt. A job whose webhook comes later is cancelled. With neither webhooks nor a history nothing can "
        "reveal such a job, and the task is submitted again once its lease lapses.",
    )
    platform_url: str = Field(
        "https://api.fal.ai",
        description="fal's Platform API, whose request history (/v1/models/requests/by-endpoint, same key) "
        "names the job of a submit whose answer was lost; empty: not used.",
    )
    platform_timeout_seconds: float = Field(
        5.0, gt=0, description="Deadline of one history lookup, pages included; past it the task waits on."
    )
    lost_job_lookup_seconds: float = Field(
        10.0,
        gt=0,
        description="Between history lookups for a task waiting on a submit of unknown outcome (one listing "
        "serves all tasks looking at once). Lower: a lost job is adopted sooner, more Platform API calls.",
    )
    task_timeout_seconds: float = Field(
        120.0, description="A task not finished this long after it was accepted fails with reason 'timeout'."
    )
    callback_grace_seconds: float = Field(
        30.0,
        description="How long after the upstream accepted a job the gateway waits for its webhook before it "
        "starts polling. Lower: lost webhooks cost less time, more status calls.",
    )
    poll_initial_seconds: float = Field(1.0, description="First interval between status polls; doubles each poll...")
    poll_max_seconds: float = Field(10.0, description="...up to this.")
    max_concurrent_submits: int = Field(
        4,
        description="Submissions in flight to the upstream, for all replicas together when REDIS_URL is set "
        "(else per replica); queued tasks wait their turn.",
    )
    submits_per_second: float = Field(
        10.0, description="Submissions per second to the upstream, shared by all replicas when REDIS_URL is set."
    )
    max_prompt_chars: int = Field(2000, description="Longest prompt (and negative prompt) accepted.")
    connect_timeout_seconds: float = Field(5.0, description="TCP/TLS connect deadline of an upstream call.")
    read_timeout_seconds: float = Field(30.0, description="Deadline for the answer of one upstream call.")


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


class ObservabilitySettings(BaseSettings):
    """Tracing (OpenTelemetry); metrics are always on at /metrics."""

    model_config = SettingsConfigDict(frozen=True, populate_by_name=True)

    otlp_endpoint: str | None = Field(
        None,
        validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT",
        description="OTLP collector; set it to turn tracing on.",
    )
    service_name: str = Field("ai-gateway", validation_alias="OTEL_SERVICE_NAME", description="Service name in traces.")


class Settings(BaseSettings):
    """Everything the gateway reads from its environment."""

    model_config = SettingsConfigDict(frozen=True)

    server: ServerSettings = Field(default_factory=ServerSettings)
    triton: TritonSettings = Field(default_factory=TritonSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    usage: UsageSettings = Field(default_factory=UsageSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    hunyuan: HunyuanSettings = Field(default_factory=HunyuanSettings)
    semantic: SemanticCacheSettings = Field(default_factory=SemanticCacheSettings)
    video: VideoSettings = Field(default_factory=VideoSettings)
    tasks: TaskStoreSettings = Field(default_factory=TaskStoreSettings)
    search: SearchSettings = Field(default_factory=SearchSettings)
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings)


def settings_groups(root: type[BaseSettings] = Settings) -> Iterator[type[BaseSettings]]:
    """Every settings class `root` is made of, depth first (a group may hold groups, e.g. the Hunyuan quota)."""
    for field in root.model_fields.values():
        group = field.annotation
        if isinstance(group, type) and issubclass(group, BaseSettings):
            yield group
            yield from settings_groups(group)


def environment_variables(group: type[BaseSettings]) -> dict[str, FieldInfo]:
    """The variables `group` reads itself (its own fields, not its groups'), by name: env_prefix + field name, or
    the field's validation_alias."""
    prefix = str(group.model_config.get("env_prefix", ""))
    variables: dict[str, FieldInfo] = {}
    for name, field in group.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseSettings):
            continue
        alias = field.validation_alias
        variables[alias.upper() if isinstance(alias, str) else f"{prefix}{name}".upper()] = field
    return variables


def all_environment_variables() -> set[str]:
    """Every variable the gateway reads."""
    return {name for group in settings_groups() for name in environment_variables(group)}
