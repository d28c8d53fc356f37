"""Hunyuan (OpenAI-compatible chat) over one pooled `aiohttp.ClientSession` for the process lifetime.

aiohttp rather than httpx here: a profile of the gateway proxying non-streamed completions at
concurrency 32 put half of its CPU in httpx/httpcore (an expiry check of every pooled connection on
each request, anyio locks); aiohttp's C parser and connector cost a fraction of that per call.

Retries with exponential back-off and jitter happen only before the first byte
of an answer (connection errors, 429, 5xx; `Retry-After` honoured, then `before_retry`, the quota's
pacing): after it, the client already has data and a retry would duplicate it.
`aiohttp.ClientError` never leaves this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from opentelemetry import propagate, trace
from pydantic import SecretStr

from gateway import metrics
from gateway.errors import (
    GatewayError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
    without_secret,
)
from gateway.settings import HunyuanSettings
from gateway.upstreams.http_errors import UpstreamErrors, retry_after_seconds
from gateway.upstreams.pool import PooledSession, strict_json

tracer = trace.get_tracer(__name__)
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
BeforeRetry = Callable[[], Awaitable[None]]  # e.g. the quota's `Slot.pace`: a retry is one more arrival upstream
_jitter = random.Random()  # not the global generator, whose state belongs to the host program (and its tests)
DRAIN_SECONDS = 1.0  # how long the end of a body may take after [DONE] before its connection is dropped


class LLMUpstreamError(UpstreamError):
    """The upstream failed in a way the client cannot fix."""


class LLMUnavailableError(UpstreamUnavailableError):
    pass


ERRORS = UpstreamErrors(
    "chat upstream", "HUNYUAN_API_KEY", LLMUpstreamError, LLMUnavailableError, not_found_param="model"
)


class LLMTimeoutError(UpstreamTimeoutError):
    pass


class LLMNotConfiguredError(UpstreamUnavailableError):
    code = "not_configured"


class LLMStreamBrokenError(LLMUpstreamError):
    """The upstream stream ended without [DONE] after sending data."""


class _RetryableError(Exception):
    """A failure before the first byte that another attempt may not repeat."""

    def __init__(self, error: GatewayError, retry_after: str | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_after = retry_after


class LLMClient:
    """Chat completions against `settings.base_url`; use as an async context manager or call `aclose`."""

    def __init__(self, settings: HunyuanSettings) -> None:
        self._settings = settings
        self._url = settings.base_url.rstrip("/") + "/chat/completions"
        self._models_url = settings.base_url.rstrip("/") + "/models"
        self._pool = PooledSession(
            max_connections=settings.max_connections,
            connect_seconds=settings.connect_timeout_seconds,
            read_seconds=settings.first_byte_timeout_seconds,  # the headers, then the idle time between chunks
            read_bufsize=2**20,  # bounds one SSE line: 2 MiB, far above any chunk an answer streams
        )

    @property
    def configured(self) -> bool:
        return self._settings.api_key is not None

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def complete(self, body: dict[str, Any], *, before_retry: BeforeRetry | None = None) -> dict[str, Any]:
        """A non-streaming completion (the body is passed through as it is); `before_retry` is awaited after
        the back-off, before each retry."""
        async with self._response({**body, "stream": False}, before_retry) as response:
            try:
                payload = json.loads(await response.read())
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                raise LLMUpstreamError(f"upstream answered an unreadable completion: {type(exc).__name__}") from exc
        if not isinstance(payload, dict):
            raise LLMUpstreamError("upstream answered a completion that is not a JSON object")
        return payload

    async def models(self) -> list[dict[str, Any]]:
        """The upstream's `GET /models` entries (OpenAI's `data`), in one attempt: a listing is not worth retrying."""
        if self._settings.api_key is None:
            raise LLMNotConfiguredError("chat is not configured: set HUNYUAN_API_KEY")
        headers = {"Authorization": f"Bearer {self._settings.api_key.get_secret_value()}"}
        try:
            async with self._pool.get().get(self._models_url, headers=headers) as response:
                if response.status >= 400:
                    metrics.LLM_ERRORS.labels(reason=str(response.status)).inc()
                    raise await _error_of(response, self._settings.api_key)
                payload = json.loads(await response.read())
        except TimeoutError as exc:
            metrics.LLM_ERRORS.labels(reason="timeout").inc()
            raise LLMTimeoutError("chat upstream did not answer in time") from exc
        except aiohttp.ClientError as exc:
            metrics.LLM_ERRORS.labels(reason="connection").inc()
            raise LLMUnavailableError(f"chat upstream unreachable: {type(exc).__name__}") from exc
        except ValueError as exc:
            raise LLMUpstreamError("upstream answered a model list that is not JSON") from exc
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list):
            raise LLMUpstreamError("upstream answered a model list without a data array")
        return [entry for entry in data if isinstance(entry, dict) and isinstance(entry.get("id"), str)]

    @asynccontextmanager
    async def stream(
        self, body: dict[str, Any], *, before_retry: BeforeRetry | None = None
    ) -> AsyncIterator[AsyncGenerator[str, None]]:
        """Open a streamed completion; yields the `data:` payloads (JSON text) as they arrive, without [DONE].

        Leaving the block closes the upstream response, so a client that goes away cancels the upstream call.
        """
        async with self._response({**body, "stream": True}, before_retry) as response:
            yield _events(response)

    @asynccontextmanager
    async def _response(
        self, body: dict[str, Any], before_retry: BeforeRetry | None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The first successful response; failures before it are retried when retrying can help."""
        if self._settings.api_key is None:
            raise LLMNotConfiguredError("chat is not configured: set HUNYUAN_API_KEY")
        headers = {
            "Authorization": f"Bearer {self._settings.api_key.get_secret_value()}",
            "Content-Type": "application/json",
        }
        data = strict_json(body).encode()
        attempts = self._settings.max_retries + 1
        # A span that is not made "current": a stream is opened in one task and closed in another,
        # where a context token could not be reset. Its context still travels in the headers.
        span = tracer.start_span("llm.chat", attributes={"llm.model": str(body.get("model", ""))})
        propagate.inject(headers, context=trace.set_span_in_context(span))
        try:
            for attempt in range(attempts):
                try:
                    response = await self._attempt(data, headers)
                except _RetryableError as retryable:
                    if attempt == attempts - 1:
                        raise retryable.error from retryable
                    await asyncio.sleep(self._backoff(attempt, retryable.retry_after))
                    if before_retry is not None:
                        await before_retry()
                    continue
                metrics.LLM_CALLS.labels(model=str(body.get("model", ""))).inc()
                try:
                    yield response
                finally:
                    # A body read to its end returns the connection to the pool; else the connection is
                    # closed, which is also how the upstream learns that a client went away.
                    if response.content.at_eof():
                        response.release()
                    else:
                        response.close()
                return
        finally:
            span.end()

    async def _attempt(self, data: bytes, headers: dict[str, str]) -> aiohttp.ClientResponse:
        try:
            response = await self._pool.get().post(self._url, data=data, headers=headers)
        except TimeoutError as exc:  # aiohttp's connect and read timeouts are TimeoutErrors too
            metrics.LLM_ERRORS.labels(reason="timeout").inc()
            raise _RetryableError(LLMTimeoutError("chat upstream did not answer in time")) from exc
        except aiohttp.ClientError as exc:
            metrics.LLM_ERRORS.labels(reason="connection").inc()
            raise _RetryableError(LLMUnavailableError(f"chat upstream unreachable: {type(exc).__name__}")) from exc
        if response.status < 400:
            return response
        error = await _error_of(response, self._settings.api_key)
        response.close()
        metrics.LLM_ERRORS.labels(reason=str(response.status)).inc()
        if response.status in RETRYABLE_STATUS:
            raise _RetryableError(error, response.headers.get("retry-after"))
        raise error

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        seconds = retry_after_seconds(retry_after)
        if seconds is not None:
            return min(seconds, self._settings.total_timeout_seconds)
        base: float = self._settings.retry_base_seconds * 2.0**attempt
        return base + _jitter.uniform(0.0, base)


async def _events(response: aiohttp.ClientResponse) -> AsyncGenerator[str, None]:
    """`data:` payloads of an SSE body. Lines are decoded whole, so a character split across network
    writes arrives whole."""
    lines = aiter(response.content)
    try:
        async for raw in lines:
            line = raw.decode("utf-8")
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                await _drain(lines)
                return
            yield data
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:  # ValueError: a line past read_bufsize
        metrics.LLM_ERRORS.labels(reason="stream_broken").inc()
        raise LLMStreamBrokenError(f"chat upstream stream broke: {type(exc).__name__}") from exc
    metrics.LLM_ERRORS.labels(reason="stream_broken").inc()
    raise LLMStreamBrokenError("chat upstream stream ended without [DONE]")


async def _drain(lines: AsyncIterator[bytes]) -> None:
    """Read the body's end after [DONE] (usually already received), so that the connection goes back to the
    pool: a response closed before its end closes its connection, and the next call would pay a new TCP and
    TLS handshake before its first token. An upstream that keeps the body open loses the connection instead."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
        async with asyncio.timeout(DRAIN_SECONDS):
            async for _ in lines:
                pass


async def _error_of(response: aiohttp.ClientResponse, api_key: SecretStr | None) -> GatewayError:
    """The upstream's error in our classes; its message passes through (an echoed key redacted), our
    credentials never do."""
    code = None
    try:
        detail = json.loads(await response.read()).get("error", {})
        message = str(detail.get("message") or detail) if isinstance(detail, dict) else str(detail)
        if isinstance(detail, dict) and isinstance(detail.get("code"), str):
            code = detail["code"]  # e.g. model_not_found: the client's to act on
    except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
        message = response.reason or ""
    message = without_secret(message, api_key)
    return ERRORS.of_status(response.status, message, response.headers.get("retry-after"), code=code)
