"""The upstreams the gateway calls: the chat API (TokenHub by default) with its quota and semantic cache, and the
video API (fal). `CHAT_*` and `VIDEO_*` were `HUNYUAN_*` and `PIKA_*` before 0.2: the old names are still read
(`renamed.RenamedPrefix`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.settings.renamed import RenamedPrefix


class ChatQuotaSettings(RenamedPrefix, BaseSettings):
    """The chat account's quota, enforced across all replicas when REDIS_URL is set. TokenHub sets its limits per
    model and inference service and shows them on the model's page in its console; it publishes no account-wide
    figure, so the defaults are a conservative start (the retired Hunyuan platform's 20 QPS / 5 concurrent)."""

    model_config = SettingsConfigDict(env_prefix="CHAT_", frozen=True)
    deprecated_prefix: ClassVar[str] = "HUNYUAN_"

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


class ChatSettings(RenamedPrefix, BaseSettings):
    """Chat through an OpenAI-compatible API (by default Tencent HY models on Tencent TokenHub), and the account's
    quota."""

    model_config = SettingsConfigDict(env_prefix="CHAT_", frozen=True)
    deprecated_prefix: ClassVar[str] = "HUNYUAN_"

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
        "CHAT_FALLBACK_MODELS) when the upstream cannot be asked: no key, an error, or an empty list.",
    )
    breaker_failures: int = Field(
        5, description="Consecutive failures that open a model's (or a host's) circuit breaker."
    )
    breaker_reset_seconds: float = Field(
        30.0, description="How long an open breaker answers 503 (a host's: is skipped) before one probe call."
    )
    quota: ChatQuotaSettings = Field(default_factory=ChatQuotaSettings)

    def fallbacks(self) -> dict[str, list[str]]:
        chains: dict[str, list[str]] = {}
        for pair in filter(None, (p.strip() for p in self.fallback_models.split(","))):
            model, _, fallback = pair.partition("=")
            chains.setdefault(model.strip(), []).append(fallback.strip())
        return chains

    def base_urls(self) -> list[str]:
        """CHAT_BASE_URL, then CHAT_BACKUP_BASE_URLS, each once, in order of preference."""
        backups = (url.strip() for url in self.backup_base_urls.split(","))
        return list(dict.fromkeys(url.rstrip("/") for url in (self.base_url.strip(), *backups) if url))

    def configured_models(self) -> list[str]:
        """CHAT_MODELS, then every model CHAT_FALLBACK_MODELS names, each once, in order."""
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


class VideoSettings(RenamedPrefix, BaseSettings):
    """Video generation through fal.ai's queue API (any fal model; Pika 2.2 by default), run as asynchronous
    tasks."""

    model_config = SettingsConfigDict(env_prefix="VIDEO_", frozen=True)
    deprecated_prefix: ClassVar[str] = "PIKA_"

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
        "(VIDEO_PLATFORM_URL), before it is submitted again; the job is then adopted. fal lists a job only once "
        "it has ended, so without webhooks this should cover most jobs' run (about the p95 of "
        "gateway_video_task_duration_seconds); a job that ends later is paid twice, and a submit that never "
        "reached fal waits this long once. The default leaves half of VIDEO_TASK_TIMEOUT_SECONDS for the new "
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
