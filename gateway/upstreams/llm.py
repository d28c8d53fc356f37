"""Hunyuan (OpenAI-compatible chat) over one pooled `httpx.AsyncClient` for the process lifetime.

Retries with exponential back-off and jitter happen only before the first byte
of an answer (connection errors, 429, 5xx; `Retry-After` honoured): after it,
the client already has data and a retry would duplicate it.
`httpx.HTTPError` never leaves this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from opentelemetry import propagate, trace

from gateway import metrics
from gateway.errors import (
    GatewayError,
    InvalidRequestError,
    NotFoundError,
    OverloadedError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from gateway.settings import LLMSettings

tracer = trace.get_tracer(__name__)
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
DRAIN_SECONDS = 1.0  # how long the end of a body may take after [DONE] before its connection is dropped


class LLMUpstreamError(UpstreamError):
    """The upstream failed in a way the client cannot fix."""


class LLMUnavailableError(UpstreamUnavailableError):
    pass


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

    def __init__(self, settings: LLMSettings, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._settings = settings
        timeout = httpx.Timeout(
            connect=settings.connect_timeout_seconds,
            read=settings.first_byte_timeout_seconds,
            write=settings.connect_timeout_seconds,
            pool=settings.first_byte_timeout_seconds,
        )
        limits = httpx.Limits(
            max_connections=settings.max_connections, max_keepalive_connections=settings.max_connections
        )
        self._client = httpx.AsyncClient(
            base_url=settings.base_url.rstrip("/") + "/", timeout=timeout, limits=limits, transport=transport
        )

    @property
    def configured(self) -> bool:
        return self._settings.api_key is not None

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """A non-streaming completion (the body is passed through as it is)."""
        async with self._response({**body, "stream": False}) as response:
            try:
                payload = json.loads(await response.aread())
            except (httpx.HTTPError, ValueError) as exc:
                raise LLMUpstreamError(f"upstream answered an unreadable completion: {type(exc).__name__}") from exc
        if not isinstance(payload, dict):
            raise LLMUpstreamError("upstream answered a completion that is not a JSON object")
        return payload

    @asynccontextmanager
    async def stream(self, body: dict[str, Any]) -> AsyncIterator[AsyncGenerator[str, None]]:
        """Open a streamed completion; yields the `data:` payloads (JSON text) as they arrive, without [DONE].

        Leaving the block closes the upstream response, so a client that goes away cancels the upstream call.
        """
        async with self._response({**body, "stream": True}) as response:
            yield _events(response)

    @asynccontextmanager
    async def _response(self, body: dict[str, Any]) -> AsyncIterator[httpx.Response]:
        """The first successful response; failures before it are retried when retrying can help."""
        if self._settings.api_key is None:
            raise LLMNotConfiguredError("chat is not configured: set HUNYUAN_API_KEY")
        headers = {"Authorization": f"Bearer {self._settings.api_key.get_secret_value()}"}
        attempts = self._settings.max_retries + 1
        # A span that is not made "current": a stream is opened in one task and closed in another,
        # where a context token could not be reset. Its context still travels in the headers.
        span = tracer.start_span("llm.chat", attributes={"llm.model": str(body.get("model", ""))})
        propagate.inject(headers, context=trace.set_span_in_context(span))
        try:
            for attempt in range(attempts):
                try:
                    response = await self._attempt(body, headers)
                except _RetryableError as retryable:
                    if attempt == attempts - 1:
                        raise retryable.error from retryable
                    await asyncio.sleep(self._backoff(attempt, retryable.retry_after))
                    continue
                metrics.LLM_CALLS.labels(model=str(body.get("model", ""))).inc()
                try:
                    yield response
                finally:
                    await response.aclose()
                return
        finally:
            span.end()

    async def _attempt(self, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        request = self._client.build_request("POST", "chat/completions", json=body, headers=headers)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            metrics.LLM_ERRORS.labels(reason="timeout").inc()
            raise _RetryableError(LLMTimeoutError("chat upstream did not answer in time")) from exc
        except httpx.TransportError as exc:
            metrics.LLM_ERRORS.labels(reason="connection").inc()
            raise _RetryableError(LLMUnavailableError(f"chat upstream unreachable: {type(exc).__name__}")) from exc
        if response.status_code < 400:
            return response
        error = await _error_of(response)
        await response.aclose()
        metrics.LLM_ERRORS.labels(reason=str(response.status_code)).inc()
        if response.status_code in RETRYABLE_STATUS:
            raise _RetryableError(error, response.headers.get("retry-after"))
        raise error

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            try:
                return float(min(float(retry_after), self._settings.total_timeout_seconds))
            except ValueError:
                pass
        base: float = self._settings.retry_base_seconds * 2.0**attempt
        return base + random.uniform(0.0, base)


async def _events(response: httpx.Response) -> AsyncGenerator[str, None]:
    """`data:` payloads of an SSE body. `aiter_lines` decodes UTF-8 incrementally, so a character split
    across network writes arrives whole."""
    lines = response.aiter_lines()
    try:
        async for line in lines:
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                await _drain(lines)
                return
            yield data
    except httpx.HTTPError as exc:
        metrics.LLM_ERRORS.labels(reason="stream_broken").inc()
        raise LLMStreamBrokenError(f"chat upstream stream broke: {type(exc).__name__}") from exc
    metrics.LLM_ERRORS.labels(reason="stream_broken").inc()
    raise LLMStreamBrokenError("chat upstream stream ended without [DONE]")


async def _drain(lines: AsyncIterator[str]) -> None:
    """Read the body's end after [DONE] (usually already received), so that the connection goes back to the
    pool: a response closed before its end closes its connection, and the next call would pay a new TCP and
    TLS handshake before its first token. An upstream that keeps the body open loses the connection instead."""
    with contextlib.suppress(httpx.HTTPError, TimeoutError):
        async with asyncio.timeout(DRAIN_SECONDS):
            async for _ in lines:
                pass


async def _error_of(response: httpx.Response) -> GatewayError:
    """The upstream's error in our classes; its message passes through, our credentials never do."""
    try:
        detail = json.loads(await response.aread()).get("error", {})
        message = str(detail.get("message") or detail) if isinstance(detail, dict) else str(detail)
    except (httpx.HTTPError, ValueError, AttributeError):
        message = response.reason_phrase
    status = response.status_code
    if status == 400:
        return InvalidRequestError(f"upstream rejected the request: {message}")
    if status == 404:
        return NotFoundError(f"upstream: {message}", param="model")
    if status == 429:
        retry_after = response.headers.get("retry-after", "1")
        seconds = int(float(retry_after)) if retry_after.replace(".", "", 1).isdigit() else 1
        return OverloadedError(f"upstream quota exceeded: {message}", retry_after=max(1, seconds))
    if status in (401, 403):
        return LLMUpstreamError("upstream rejected the gateway's credentials (check HUNYUAN_API_KEY)")
    if status in (502, 503, 504):
        return LLMUnavailableError(f"chat upstream unavailable ({status}): {message}")
    return LLMUpstreamError(f"chat upstream failed ({status}): {message}")
