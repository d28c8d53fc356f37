"""Chat, framework-free: exact cache, quota slot, circuit breaker and fallback models around the upstream."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack, aclosing
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from gateway import metrics
from gateway.cache.chat import ChatAnswer, ExactChatCache, exact_key, prompt_chars
from gateway.cache.semantic import SemanticIndex
from gateway.errors import (
    GatewayError,
    InvalidRequestError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from gateway.protocol.unicode import require_unicode
from gateway.quota.base import QuotaLimiter, Slot
from gateway.services.shared_stream import SharedStreams
from gateway.services.single_flight import SingleFlight
from gateway.upstreams.breaker import BreakerBoard
from gateway.upstreams.chat import ChatClient

ChatCacheOutcome = Literal["hit", "miss", "semantic"]
DEFAULT_ANSWER_BUDGET = 512  # tokens reserved for an answer without max_tokens
REASONING_ANSWER_BUDGET = 2048  # ... when it reasons first (TokenHub's guides: max_tokens >= 2048 to think)


@dataclass(frozen=True)
class CacheResult:
    """How a chat request was answered: `hit` (exact), `semantic` (with its similarity) or `miss`."""

    outcome: ChatCacheOutcome
    similarity: float | None = None


class ChatService:
    def __init__(
        self,
        upstream: ChatClient,
        cache: ExactChatCache | None,
        semantic: SemanticIndex | None,
        quota: QuotaLimiter,
        breakers: BreakerBoard,
        fallbacks: dict[str, list[str]],
        *,
        max_prompt_chars: int,
        timeout_seconds: float,
    ) -> None:
        self._upstream = upstream
        self._cache = cache
        self._semantic = semantic if cache is not None else None  # it points at answers in the exact cache
        self._quota = quota
        self._breakers = breakers
        self._fallbacks = fallbacks
        self._max_prompt_chars = max_prompt_chars
        self._timeout = timeout_seconds
        self._in_flight: SingleFlight[str, dict[str, Any]] = SingleFlight(cancel_when_abandoned=True)
        self._streams = SharedStreams()

    async def complete(self, body: dict[str, Any], *, use_cache: bool = True) -> tuple[dict[str, Any], CacheResult]:
        """A non-streamed completion; identical concurrent requests share one upstream call, which is
        cancelled (freeing its quota slot) when the last of them has gone (e.g. past its deadline)."""
        self._validate(body)
        key = exact_key(body)
        if use_cache and (cached := await self._cached(body, key)) is not None:
            answer, result = cached
            return answer.as_completion(), result
        completion = await self._in_flight.run(key, partial(self._complete_upstream, body, key))
        return completion, CacheResult("miss")

    async def stream(
        self, body: dict[str, Any], *, use_cache: bool = True
    ) -> tuple[AsyncGenerator[list[str], None], CacheResult]:
        """Chunks (JSON texts) of a streamed answer, in batches of those received since the last batch
        (a cached answer is one batch). This returns once the first chunk has arrived, so failures before it
        are retried and fall back like a non-streamed call's and become a proper status. Identical requests
        arriving while it opens or streams follow the same upstream call."""
        self._validate(body)
        key = exact_key(body)
        if use_cache and (cached := await self._cached(body, key)) is not None:
            answer, result = cached
            return _replay(answer), result
        return await self._streams.follow(key, partial(self._open_stream, body, key)), CacheResult("miss")

    async def _open_stream(self, body: dict[str, Any], key: str) -> AsyncGenerator[list[str], None]:
        """The relay of a stream whose first chunk has arrived (from the requested model or a fallback)."""
        stack = AsyncExitStack()
        try:
            model, events, slot = await self._open(stack, body, stream=True)
        except BaseException:
            await stack.aclose()
            raise
        return self._relay(stack, body, key, model, events, slot)

    async def upstream_models(self) -> list[dict[str, Any]]:
        """The models the upstream lists (OpenAI's model entries); raises its UpstreamError (e.g. no key)."""
        return await self._upstream.models()

    def _validate(self, body: dict[str, Any]) -> None:
        require_unicode(body)
        if not isinstance(body.get("stream_options", {}), dict):
            kind = type(body["stream_options"]).__name__
            raise InvalidRequestError(f"stream_options must be an object, got {kind}", param="stream_options")
        chars = prompt_chars(body)
        if chars > self._max_prompt_chars:
            raise InvalidRequestError(
                f"prompt has {chars} characters; the maximum is {self._max_prompt_chars}", param="messages"
            )

    async def _cached(self, body: dict[str, Any], key: str) -> tuple[ChatAnswer, CacheResult] | None:
        """The exact answer, else the answer to a paraphrase of the same conversation."""
        if self._cache is None:
            return None
        answer = await self._cache.get(key)
        result = CacheResult("hit")
        if answer is None and self._semantic is not None and (hit := await self._semantic.lookup(body)):
            answer = await self._cache.get(hit.answer_key, count=False)
            result = CacheResult("semantic", hit.similarity)
        if answer is None:
            return None
        layer = "exact" if result.outcome == "hit" else "semantic"
        metrics.CHAT_SAVED_CALLS.labels(layer=layer).inc()
        metrics.CHAT_SAVED_TOKENS.labels(layer=layer).inc(answer.usage.get("total_tokens", 0))
        return answer, result

    async def _store(self, body: dict[str, Any], key: str, model: str, answer: ChatAnswer) -> None:
        """Keep the answer for the next identical request, unless a fallback model gave it (that request asks
        for the requested model, which may be back by then) or it has several choices (`n`: the cache keeps
        and replays one)."""
        if model != body["model"] or body.get("n") not in (None, 1):
            return
        stored = self._cache is not None and await self._cache.put(key, body, answer)
        if stored and self._semantic is not None:
            await self._semantic.add(body, key)

    async def _complete_upstream(self, body: dict[str, Any], key: str) -> dict[str, Any]:
        async with asyncio.timeout(self._timeout), AsyncExitStack() as stack:
            model, result, slot = await self._open(stack, body, stream=False)
            completion: dict[str, Any] = result
            account_usage(model, completion.get("usage") or {}, slot)
        await self._store(body, key, model, ChatAnswer(completion=completion))
        return completion

    async def _open(self, stack: AsyncExitStack, body: dict[str, Any], *, stream: bool) -> tuple[str, Any, Slot]:
        """Try the requested model, then its fallbacks, skipping open breakers; the first that answers wins.

        Returns (model, completion or event iterator, quota slot); the slot and the upstream
        response stay open in `stack`. A failure before the first byte moves on to the next model."""
        requested = str(body["model"])
        last_error: Exception | None = None
        for model in [requested, *self._fallbacks.get(requested, [])]:
            breaker = self._breakers[model]
            if not breaker.allow():
                seconds = max(1, math.ceil(breaker.retry_after()))
                last_error = UpstreamUnavailableError(
                    f"model {model!r} is failing; retry in {seconds} s", headers={"Retry-After": str(seconds)}
                )
                continue
            attempt = AsyncExitStack()
            slot: Slot | None = None
            try:
                slot = await attempt.enter_async_context(self._quota.slot(estimate_tokens(body)))
                upstream_body = {**body, "model": model}
                if stream:  # always with its usage: the key's record and limits need it; clients may not get it
                    upstream_body["stream_options"] = {**body.get("stream_options", {}), "include_usage": True}
                    opened = self._upstream.stream(upstream_body, before_retry=slot.pace)
                    result: Any = await attempt.enter_async_context(opened)
                else:
                    result = await self._upstream.complete(upstream_body, before_retry=slot.pace)
            except UpstreamError as exc:
                _nothing_billed(slot, exc)
                await attempt.aclose()
                breaker.record_failure()
                last_error = exc
                continue
            except BaseException as exc:  # our quota refused, the request was rejected, or the caller left
                _nothing_billed(slot, exc)
                await attempt.aclose()
                breaker.release()
                raise
            if not stream:
                breaker.record_success()
            stack.push_async_exit(attempt)
            return model, result, slot
        assert last_error is not None
        raise last_error

    async def _relay(
        self,
        stack: AsyncExitStack,
        body: dict[str, Any],
        key: str,
        model: str,
        events: AsyncGenerator[list[str], None],
        slot: Slot,
    ) -> AsyncGenerator[list[str], None]:
        """Forward each batch of upstream chunks as it arrives; store the sequence if the answer ended normally.
        The chunks are decoded once the stream has ended, all in one call, not one by one on their way."""
        kept: list[str] = []
        keep_all = self._cache is not None  # else only the usage is needed, not every chunk
        breaker = self._breakers[model]
        try:
            async with aclosing(events):
                async for batch in events:
                    yield batch
                    if keep_all:
                        kept += batch
                    else:
                        kept += [payload for payload in batch if '"usage"' in payload]
            answer = ChatAnswer(chunks=json.loads(f"[{','.join(kept)}]"))
            account_usage(model, answer.usage, slot)
        except UpstreamError:
            breaker.record_failure()
            raise
        except BaseException:  # the last client went away (cancelled), or a chunk was not JSON
            breaker.release()
            raise
        finally:
            await stack.aclose()  # also when the client went away: that cancels the upstream call
        breaker.record_success()
        await self._store(body, key, model, answer)


def account_usage(model: str, usage: dict[str, Any], slot: Slot) -> None:
    """Count the billed tokens and settle the quota's token estimate with them, reasoning included. An answer
    without usage (an upstream that ignored `stream_options.include_usage`) keeps its estimate charged, rather
    than none."""
    prompt, completion = _token_count(usage, "prompt_tokens"), _token_count(usage, "completion_tokens")
    if prompt is None and completion is None:
        return
    prompt, completion = prompt or 0, completion or 0
    details = usage.get("completion_tokens_details")
    reasoning = _token_count(details, "reasoning_tokens") if isinstance(details, dict) else None
    metrics.CHAT_TOKENS.labels(model=model, kind="prompt").inc(prompt)
    metrics.CHAT_TOKENS.labels(model=model, kind="completion").inc(completion)
    if reasoning:
        metrics.CHAT_TOKENS.labels(model=model, kind="reasoning").inc(reasoning)
    # OpenAI counts reasoning inside completion_tokens; an upstream that reports it beside them (a larger
    # reasoning count, or a larger total) is charged the larger figure, so thinking never escapes the budget.
    billed = prompt + max(completion, reasoning or 0)
    slot.settle(max(billed, _token_count(usage, "total_tokens") or 0))


def _nothing_billed(slot: Slot | None, error: BaseException) -> None:
    """Give a failed call's token estimate back when the upstream answered with an error (nothing generated,
    nothing billed); a call that timed out or was cancelled may have been generating, and keeps it."""
    if slot is not None and isinstance(error, GatewayError) and not isinstance(error, UpstreamTimeoutError):
        slot.settle(0)


def _token_count(usage: dict[str, Any], name: str) -> int | None:
    value = usage.get(name)
    return value if isinstance(value, int) and value >= 0 else None


def estimate_tokens(body: dict[str, Any]) -> int:
    """What a call may cost before it is made: prompt characters / 4 plus the answer budget (`max_tokens` or
    `max_completion_tokens`; unset: 512, or 2048 when reasoning is asked for, TokenHub's advice for thinking)."""
    budget = body.get("max_tokens") or body.get("max_completion_tokens")
    if not isinstance(budget, int) or budget < 1:
        budget = REASONING_ANSWER_BUDGET if reasoning_requested(body) else DEFAULT_ANSWER_BUDGET
    return math.ceil(prompt_chars(body) / 4) + budget


def usage_requested(body: dict[str, Any]) -> bool:
    """Whether the client asked for a stream's usage chunk (`stream_options: {"include_usage": true}`); the
    gateway asks the upstream for it either way, and passes it on only then."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def reasoning_requested(body: dict[str, Any]) -> bool:
    """Whether the request turns reasoning on: the thinking switch enabled, or an effort other than none."""
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "disabled"):
        return bool(thinking["type"] == "enabled")
    return body.get("reasoning_effort") not in (None, "none")


async def _replay(answer: ChatAnswer) -> AsyncGenerator[list[str], None]:
    yield [json.dumps(chunk, ensure_ascii=False) for chunk in answer.as_chunks()]
