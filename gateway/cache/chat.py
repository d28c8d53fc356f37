"""The exact prompt cache: a finished chat answer, keyed by the canonical request.

A streamed answer is stored as its chunk sequence and replayed chunk by chunk;
a non-streamed one as the completion. Either can answer either kind of request,
the reasoning (`reasoning_content`) included. The thinking switch and the reasoning
effort are part of the request, so of the key: a reasoned answer never answers a
request that turned reasoning off.
Only answers that ended normally are stored (finish_reason stop or tool_calls).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from gateway import metrics
from gateway.cache.base import ByteStore, CacheStoreError

log = logging.getLogger(__name__)

CACHEABLE_FINISH_REASONS = frozenset({"stop", "tool_calls"})
# Fields that change how the answer is delivered, not what it says.
DELIVERY_FIELDS = frozenset({"stream", "stream_options", "user"})


def exact_key(body: dict[str, Any]) -> str:
    """SHA-256 of the canonical request: sorted keys, compact separators, delivery fields left out."""
    canonical = {k: v for k, v in body.items() if k not in DELIVERY_FIELDS}
    text = json.dumps(canonical, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "chat:v1:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def prompt_chars(body: dict[str, Any]) -> int:
    """Characters the upstream reads: each message's content and the reasoning an assistant turn passes back."""
    return sum(
        len(json.dumps(m.get("content"), ensure_ascii=False)) + len(str(m.get("reasoning_content") or ""))
        for m in body.get("messages", [])
    )


@dataclass(frozen=True)
class TtlPolicy:
    """Longer prompts are asked again less often by chance, so their answers are kept longer (capped)."""

    base_seconds: int = 3600
    per_prompt_char_seconds: int = 10
    max_seconds: int = 24 * 3600

    def for_request(self, body: dict[str, Any]) -> int:
        return min(self.base_seconds + self.per_prompt_char_seconds * prompt_chars(body), self.max_seconds)


@dataclass
class ChatAnswer:
    """One finished answer: the streamed chunks, or the completion object."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    completion: dict[str, Any] | None = None

    @property
    def finish_reason(self) -> str | None:
        if self.completion is not None:
            return str(self.completion["choices"][0].get("finish_reason"))
        reasons = [c["choices"][0].get("finish_reason") for c in self.chunks if c.get("choices")]
        return next((str(r) for r in reversed(reasons) if r), None)

    @property
    def usage(self) -> dict[str, int]:
        source = [self.completion] if self.completion is not None else self.chunks
        found = [item["usage"] for item in source if item.get("usage")]
        return dict(found[-1]) if found else {}

    def as_chunks(self) -> list[dict[str, Any]]:
        return self.chunks if self.completion is None else completion_to_chunks(self.completion)

    def as_completion(self) -> dict[str, Any]:
        return self.completion if self.completion is not None else chunks_to_completion(self.chunks)

    def encode(self) -> bytes:
        return json.dumps({"chunks": self.chunks, "completion": self.completion}, ensure_ascii=False).encode()

    @classmethod
    def decode(cls, data: bytes) -> ChatAnswer:
        value = json.loads(data)
        return cls(chunks=list(value["chunks"]), completion=value["completion"])


def chunks_to_completion(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate a chunk sequence into the non-streamed completion it stands for."""
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    tool_calls: dict[int, dict[str, Any]] = {}
    finish_reason = None
    for chunk in chunks:
        for choice in chunk.get("choices", [])[:1]:
            delta = choice.get("delta", {})
            message["content"] += delta.get("content") or ""
            if delta.get("reasoning_content"):
                message["reasoning_content"] = message.get("reasoning_content", "") + delta["reasoning_content"]
            for call in delta.get("tool_calls") or []:
                merged = tool_calls.setdefault(call.get("index", 0), {"function": {"arguments": ""}})
                merged.update({k: v for k, v in call.items() if k not in ("function", "index")})
                function = call.get("function") or {}
                merged["function"]["arguments"] += function.get("arguments") or ""
                merged["function"].update({k: v for k, v in function.items() if k != "arguments"})
            finish_reason = choice.get("finish_reason") or finish_reason
    if tool_calls:
        message["tool_calls"] = [tool_calls[i] for i in sorted(tool_calls)]
    first = chunks[0] if chunks else {}
    completion = {
        "id": first.get("id", ""),
        "object": "chat.completion",
        "created": first.get("created", 0),
        "model": first.get("model", ""),
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    usage = ChatAnswer(chunks=chunks).usage
    if usage:
        completion["usage"] = usage
    return completion


def completion_to_chunks(completion: dict[str, Any]) -> list[dict[str, Any]]:
    """A completion as the chunk sequence a stream would have carried: the reasoning (if any), the message, the
    finish, then the usage in a chunk of its own (no choices), as an upstream asked for it sends it; the
    reasoning has its own chunk so that it comes before the answer, as it streams."""
    choice = completion["choices"][0]
    head = {k: completion.get(k) for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    delta = {k: v for k, v in choice.get("message", {}).items() if v is not None}
    if "tool_calls" in delta:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(delta["tool_calls"])]
    deltas = [delta]
    if reasoning := delta.pop("reasoning_content", None):
        deltas = [{"role": delta.pop("role", "assistant"), "reasoning_content": reasoning}, delta]
    last = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason")}]}
    usage = [{**head, "choices": [], "usage": completion["usage"]}] if completion.get("usage") else []
    return [*({**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas), last, *usage]


class ExactChatCache:
    """Answers by exact request, in a `ByteStore`; a failing store is counted and bypassed."""

    name = "chat_exact"

    def __init__(self, store: ByteStore, ttl: TtlPolicy | None = None) -> None:
        self._store = store
        self._ttl = ttl or TtlPolicy()

    async def get(self, key: str, *, count: bool = True) -> ChatAnswer | None:
        """The answer stored under `key`; `count=False` for reads that are not lookups of their own."""
        try:
            (value,) = await self._store.get_many([key])
        except CacheStoreError as exc:
            metrics.CACHE_ERRORS.labels(cache=self.name, operation="get").inc()
            log.debug("chat cache unavailable: %s", exc)  # counted; the embedding cache logs the outage once
            return None
        answer = None
        if value is not None:
            try:
                answer = ChatAnswer.decode(value)
            except (ValueError, KeyError, TypeError):
                metrics.CACHE_ERRORS.labels(cache=self.name, operation="get").inc()
        if count:
            metrics.CACHE_LOOKUPS.labels(cache=self.name, result="hit" if answer else "miss").inc()
        return answer

    async def put(self, key: str, body: dict[str, Any], answer: ChatAnswer) -> bool:
        """Store the answer to `body` if it ended normally; True when stored."""
        if answer.finish_reason not in CACHEABLE_FINISH_REASONS:
            return False
        try:
            await self._store.set_many({key: answer.encode()}, self._ttl.for_request(body))
        except CacheStoreError:
            metrics.CACHE_ERRORS.labels(cache=self.name, operation="set").inc()
            return False
        return True

    async def aclose(self) -> None:
        await self._store.aclose()
