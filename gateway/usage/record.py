"""One request's usage (`Usage`) and how the chat and embedding answers' `usage` objects become one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Counted fields, in the order of the usage API's rows and CSV columns.
COUNTERS = (
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cached_requests",
    "saved_tokens",
    "embedding_texts",
    "embedding_tokens",
    "videos",
    "video_seconds",
    "search_queries",
    "search_documents",
    "rerank_documents",
    "rerank_tokens",
    "cost",
)


@dataclass(frozen=True)
class Usage:
    """What one answered request used. `cached_tokens` (the upstream's prompt cache) only prices the request."""

    requests: int = 1
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_requests: int = 0
    saved_tokens: int = 0  # upstream tokens a gateway cache answer did not spend
    embedding_texts: int = 0
    embedding_tokens: int = 0
    videos: int = 0
    video_seconds: float = 0.0
    search_queries: int = 0
    search_documents: int = 0
    rerank_documents: int = 0
    rerank_tokens: int = 0  # the pairs' tokens: the query counts once per document it is scored with
    cost: float = 0.0
    cached_tokens: int = 0

    def counters(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in COUNTERS}  # not asdict(): it deep-copies every field

    def with_cost(self, cost: float) -> Usage:
        """A copy at `cost`, built without `dataclasses.replace`'s per-field work (it runs for every request)."""
        priced = object.__new__(Usage)
        priced.__dict__.update(self.__dict__, cost=cost)
        return priced

    @property
    def tokens(self) -> int:
        """What a token budget counts: chat prompt + completion, embedding and rerank tokens."""
        return self.prompt_tokens + self.completion_tokens + self.embedding_tokens + self.rerank_tokens


def chat_usage(usage: dict[str, Any] | None, *, cached: bool) -> Usage:
    """From an OpenAI chat `usage` object; an answer from the gateway's cache costs no upstream tokens."""
    usage = usage or {}
    if cached:
        saved = _count(usage.get("prompt_tokens")) + _count(usage.get("completion_tokens"))
        return Usage(cached_requests=1, saved_tokens=saved)
    details = usage.get("completion_tokens_details") or {}
    prompt_details = usage.get("prompt_tokens_details") or {}
    return Usage(
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
        reasoning_tokens=_count(details.get("reasoning_tokens") if isinstance(details, dict) else None),
        cached_tokens=_count(prompt_details.get("cached_tokens") if isinstance(prompt_details, dict) else None),
    )


DEFAULT_VIDEO_SECONDS = 5.0  # Pika 2.2's length when the request names none


def video_usage(options: dict[str, Any] | None) -> Usage:
    """One video of the length asked for (`duration`, passed through to the model), else the model's default."""
    duration = (options or {}).get("duration", DEFAULT_VIDEO_SECONDS)
    seconds = float(duration) if isinstance(duration, int | float) and duration > 0 else DEFAULT_VIDEO_SECONDS
    return Usage(videos=1, video_seconds=seconds)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0
