"""Who may call and what they are charged: API keys, the usage record and its prices, per-key and per-team limits."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class ModelPrice(BaseModel):
    """One model's prices; unset prices count as 0."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(0.0, ge=0, description="Per 1,000,000 prompt tokens (not served from the prompt cache).")
    output: float = Field(0.0, ge=0, description="Per 1,000,000 completion tokens (reasoning included).")
    cached: float = Field(0.0, ge=0, description="Per 1,000,000 prompt tokens the upstream served from its cache.")
    embedding: float = Field(0.0, ge=0, description="Per 1,000 embedding tokens.")
    rerank: float = Field(0.0, ge=0, description="Per 1,000 rerank tokens (query and document of each pair).")
    video_second: float = Field(0.0, ge=0, description="Per second of generated video.")


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

    watch_token_secret: SecretStr | None = Field(
        None,
        description="Signs the watch tokens of `POST /v1/tasks/{id}/token` (what a browser holds to watch one task "
        "over WebSocket). Every replica needs the same value. Unset: derived from VIDEO_API_KEY, which every replica "
        "has (as the webhook URLs' tokens are); set it to rotate the tokens apart from the fal key, or to keep whoever "
        "holds that key from minting them. Changing it voids the tokens out (sockets already open stay open).",
    )
    watch_token_seconds: float = Field(
        300.0,
        gt=0,
        description="How long a watch token opens sockets, from when it was issued. It is checked when a socket opens "
        "only: a socket outlives its token. Longer: a leaked token works longer; shorter: a page that reconnects "
        "must fetch a new one from its back end sooner.",
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
        description="Task watchers at once in this process, apart from GATEWAY_MAX_IN_FLIGHT: each event stream "
        "(REST and gRPC) is one, and each WebSocket one per task it follows (at least one). A watcher waits minutes "
        "at almost no cost. Above it, 429 + Retry-After (a WebSocket: closed with 1008); each holds a connection.",
    )
    max_task_watchers_per_caller: int = Field(
        256,
        ge=1,
        description="Task watchers one API key may hold at once in this process (the same count as "
        "GATEWAY_MAX_TASK_WATCHERS: event streams, gRPC watches and WebSocket subscriptions together), so that one "
        "key cannot take every watcher of a replica. Above it, 429 `too_many_watchers` (a WebSocket: closed with "
        "1008). Counted per replica, not across replicas; not applied while no keys are configured (one anonymous "
        "caller). Higher: a back end that watches many tasks through one key needs it.",
    )
