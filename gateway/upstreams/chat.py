"""The chat upstream (OpenAI-compatible; TokenHub by default) over one pooled `aiohttp.ClientSession` per host
for the process lifetime.

aiohttp rather than httpx here: a profile of the gateway proxying non-streamed completions at
concurrency 32 put half of its CPU in httpx/httpcore (an expiry check of every pooled connection on
each request, anyio locks); aiohttp's C parser and connector cost a fraction of that per call.

Retries happen only before the first byte of an answer (for a stream: its first chunk); after it, the
client already has data and a retry would duplicate it. Within one attempt a host that cannot be reached,
answers 5xx, or breaks or stalls before its first chunk passes the call to the next host at once
(`chat_hosts.py`); a 429 (the account's, on every host) or a round where every host failed waits for the
back-off with jitter (or `Retry-After`), then `before_retry` (the quota's pacing), then tries again.
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
from gateway.settings import ChatSettings
from gateway.upstreams.chat_hosts import ChatHost, ChatHosts
from gateway.upstreams.http_errors import UpstreamErrors, retry_after_seconds
from gateway.upstreams.pool import strict_json

tracer = trace.get_tracer(__name__)
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
BeforeRetry = Callable[[], Awaitable[None]]  # e.g. the quota's `Slot.pace`: a retry is one more arrival upstream
_jitter = random.Random()  # not the global generator, whose state belongs to the host program (and its tests)
DRAIN_SECONDS = 1.0  # how long the end of a body may take after [DONE] before its connection is dropped
MAX_LINE_BYTES = 2**21  # one SSE line, far above any chunk an answer streams: a longer one breaks the stream


class ChatUpstreamError(UpstreamError):
    """The chat upstream failed in a way the client cannot fix: it refused the gateway's credentials (401,
    403), answered an unexpected error status, or an unreadable completion or model list.

    Do: client: retry later; operator: for credentials check `CHAT_API_KEY`, otherwise the message quotes the
    upstream's answer.
    """


class ChatUnavailableError(UpstreamUnavailableError):
    """The chat upstream could not be reached or answered 502, 503 or 504, on every attempt and host; or every
    host's circuit breaker is open (then with `Retry-After`).

    Do: client: retry later; operator: reach `CHAT_BASE_URL` from a pod, the vendor's status;
    `CHAT_BACKUP_BASE_URLS` and `CHAT_FALLBACK_MODELS` soften the next outage.
    """


ERRORS = UpstreamErrors(
    "chat upstream", "CHAT_API_KEY", ChatUpstreamError, ChatUnavailableError, not_found_param="model"
)


class ChatTimeoutError(UpstreamTimeoutError):
    """The chat upstream did not connect (`CHAT_CONNECT_TIMEOUT_SECONDS`) or send its answer's first byte
    (`CHAT_FIRST_BYTE_TIMEOUT_SECONDS`) in time, on every attempt.

    Do: client: retry; operator: the vendor's latency; long reasoning before the first token needs a longer
    first-byte timeout.
    """


class ChatNotConfiguredError(UpstreamUnavailableError):
    """A chat route was called on a gateway started without `CHAT_API_KEY`.

    Do: operator: set `CHAT_API_KEY` (Helm: the gateway's Secret) and restart the gateway.
    """

    code = "not_configured"


class ChatStreamBrokenError(ChatUpstreamError):
    """The chat upstream's stream broke (connection lost, a line too long or not UTF-8) or ended without
    `[DONE]`. Before its first chunk the next host or attempt is tried; after it, the client's stream ends with
    this error as its last event.

    Do: client: send the request again (a cut answer is not a finished one); operator:
    `gateway_chat_upstream_errors_total{reason="stream_broken"}` by host.
    """


class ChatStreamStalledError(ChatTimeoutError):
    """The chat upstream's stream went silent for longer than `CHAT_FIRST_BYTE_TIMEOUT_SECONDS`. Before its
    first chunk the next host or attempt is tried; after it, the client's stream ends with this error as its
    last event.

    Do: client: send the request again; operator: the vendor's latency, or a longer first-byte timeout for
    models that pause that long.
    """


class _RetryableError(Exception):
    """A failure before the first byte that another attempt may not repeat; never answered as itself.

    Do: nothing: the client tries again after a back-off, and the last attempt raises `error`.
    """

    def __init__(self, error: GatewayError, retry_after: str | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_after = retry_after


class _HostFailedError(_RetryableError):
    """The host could not be reached, answered 5xx, or its stream broke or stalled before the first chunk:
    the next host may do better at once.

    Do: nothing: the next host is tried, and the host's circuit breaker counts the failure.
    """


class ChatClient:
    """Chat completions against `CHAT_BASE_URL`, then its backups; use as an async context manager or call
    `aclose`."""

    def __init__(self, settings: ChatSettings) -> None:
        self._settings = settings
        self._hosts = ChatHosts(settings)

    @property
    def configured(self) -> bool:
        return self._settings.api_key is not None

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._hosts.aclose()

    async def complete(self, body: dict[str, Any], *, before_retry: BeforeRetry | None = None) -> dict[str, Any]:
        """A non-streaming completion (the body is passed through as it is); `before_retry` is awaited after
        the back-off, before each retry."""
        async with self._opened({**body, "stream": False}, before_retry) as (response, _):
            try:
                payload = json.loads(await response.read())
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                raise ChatUpstreamError(f"upstream answered an unreadable completion: {type(exc).__name__}") from exc
        if not isinstance(payload, dict):
            raise ChatUpstreamError("upstream answered a completion that is not a JSON object")
        return payload

    async def models(self) -> list[dict[str, Any]]:
        """The upstream's `GET /models` entries (OpenAI's `data`), in one attempt: a listing is not worth retrying."""
        if self._settings.api_key is None:
            raise ChatNotConfiguredError("chat is not configured: set CHAT_API_KEY")
        headers = {"Authorization": f"Bearer {self._settings.api_key.get_secret_value()}"}
        host = self._hosts.preferred()
        try:
            async with host.pool.get().get(host.models_url, headers=headers) as response:
                if response.status >= 400:
                    metrics.CHAT_UPSTREAM_ERRORS.labels(reason=str(response.status), host=host.name).inc()
                    raise await _error_of(response, self._settings.api_key)
                payload = json.loads(await response.read())
        except TimeoutError as exc:
            metrics.CHAT_UPSTREAM_ERRORS.labels(reason="timeout", host=host.name).inc()
            raise ChatTimeoutError("chat upstream did not answer in time") from exc
        except aiohttp.ClientError as exc:
            metrics.CHAT_UPSTREAM_ERRORS.labels(reason="connection", host=host.name).inc()
            raise ChatUnavailableError(f"chat upstream unreachable: {type(exc).__name__}") from exc
        except ValueError as exc:
            raise ChatUpstreamError("upstream answered a model list that is not JSON") from exc
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list):
            raise ChatUpstreamError("upstream answered a model list without a data array")
        return [entry for entry in data if isinstance(entry, dict) and isinstance(entry.get("id"), str)]

    @asynccontextmanager
    async def stream(
        self, body: dict[str, Any], *, before_retry: BeforeRetry | None = None
    ) -> AsyncIterator[AsyncGenerator[list[str], None]]:
        """Open a streamed completion; yields the `data:` payloads (JSON texts) as they arrive, without [DONE],
        in batches: those that came in one network read.

        It is open once the first payload has arrived: a failure before it is retried (another host, a
        back-off) like a non-streamed call's. Leaving the block closes the upstream response, so a client that
        goes away cancels the upstream call.
        """
        async with self._opened({**body, "stream": True}, before_retry) as (_, payloads):
            yield payloads

    @asynccontextmanager
    async def _opened(
        self, body: dict[str, Any], before_retry: BeforeRetry | None
    ) -> AsyncIterator[tuple[aiohttp.ClientResponse, AsyncGenerator[list[str], None]]]:
        """The first successful response (and, for a stream, its payloads from the first one on); failures
        before it are retried when retrying can help."""
        if self._settings.api_key is None:
            raise ChatNotConfiguredError("chat is not configured: set CHAT_API_KEY")
        headers = {
            "Authorization": f"Bearer {self._settings.api_key.get_secret_value()}",
            "Content-Type": "application/json",
        }
        data = strict_json(body).encode()
        attempts = self._settings.max_retries + 1
        # A span that is not made "current": a stream is opened in one task and closed in another,
        # where a context token could not be reset. Its context still travels in the headers.
        span = tracer.start_span("chat.upstream", attributes={"chat.model": str(body.get("model", ""))})
        propagate.inject(headers, context=trace.set_span_in_context(span))
        try:
            for attempt in range(attempts):
                try:
                    host, response, first, events = await self._on_some_host(data, headers, bool(body["stream"]))
                except _RetryableError as retryable:
                    if attempt == attempts - 1:
                        raise retryable.error from retryable
                    await asyncio.sleep(self._backoff(attempt, retryable.retry_after))
                    if before_retry is not None:
                        await before_retry()
                    continue
                span.set_attribute("chat.host", host.name)
                metrics.CHAT_UPSTREAM_CALLS.labels(model=str(body.get("model", "")), host=host.name).inc()
                payloads = _prepend(first, events)
                try:
                    yield response, payloads
                finally:
                    await payloads.aclose()
                    await events.aclose()  # `payloads` closes it only if it had begun
                    # A body read to its end returns the connection to the pool; else the connection is
                    # closed, which is also how the upstream learns that a client went away.
                    if response.content.at_eof():
                        response.release()
                    else:
                        response.close()
                return
        finally:
            span.end()

    async def _on_some_host(
        self, data: bytes, headers: dict[str, str], stream: bool
    ) -> tuple[ChatHost, aiohttp.ClientResponse, list[str] | None, AsyncGenerator[list[str], None]]:
        """One attempt: each host whose breaker lets it, in order, until one answers. A 429 is the account's
        (every host shares it) and ends the attempt; so does a 4xx, which no host would answer otherwise."""
        failure: _HostFailedError | None = None
        for host in self._hosts.allowed():
            try:
                response, first, events = await self._attempt(host, data, headers, stream)
            except _HostFailedError as failed:
                self._hosts.failed(host)
                failure = failed
                continue
            except (GatewayError, _RetryableError):
                self._hosts.answered(host)  # the host answered: it is up, the request or the account is not
                raise
            except BaseException:
                self._hosts.released(host)
                raise
            self._hosts.answered(host)
            return host, response, first, events
        if failure is not None:
            raise failure
        seconds = self._hosts.retry_after_seconds()
        raise ChatUnavailableError(
            f"every chat upstream host is failing; retry in {seconds} s", headers={"Retry-After": str(seconds)}
        )

    async def _attempt(
        self, host: ChatHost, data: bytes, headers: dict[str, str], stream: bool
    ) -> tuple[aiohttp.ClientResponse, list[str] | None, AsyncGenerator[list[str], None]]:
        """The response, and for a stream its first batch of payloads (None: [DONE] came first) and the
        batches after it."""
        try:
            response = await host.pool.get().post(host.chat_url, data=data, headers=headers)
        except TimeoutError as exc:  # aiohttp's connect and read timeouts are TimeoutErrors too
            metrics.CHAT_UPSTREAM_ERRORS.labels(reason="timeout", host=host.name).inc()
            raise _HostFailedError(ChatTimeoutError("chat upstream did not answer in time")) from exc
        except aiohttp.ClientError as exc:
            metrics.CHAT_UPSTREAM_ERRORS.labels(reason="connection", host=host.name).inc()
            raise _HostFailedError(ChatUnavailableError(f"chat upstream unreachable: {type(exc).__name__}")) from exc
        if response.status >= 400:
            error = await _error_of(response, self._settings.api_key)
            response.close()
            metrics.CHAT_UPSTREAM_ERRORS.labels(reason=str(response.status), host=host.name).inc()
            if response.status >= 500:
                raise _HostFailedError(error, response.headers.get("retry-after"))
            if response.status == 429:
                raise _RetryableError(error, response.headers.get("retry-after"))
            raise error
        if not stream:
            return response, None, _nothing()
        events = _events(response, host.name)
        try:
            first = await anext(events, None)
        except (ChatUpstreamError, ChatTimeoutError) as exc:  # it broke or stalled before its first chunk
            response.close()
            raise _HostFailedError(exc) from exc
        except BaseException:
            await events.aclose()
            response.close()
            raise
        return response, first, events

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        seconds = retry_after_seconds(retry_after)
        if seconds is not None:
            return min(seconds, self._settings.total_timeout_seconds)
        base: float = self._settings.retry_base_seconds * 2.0**attempt
        return base + _jitter.uniform(0.0, base)


async def _prepend(first: list[str] | None, rest: AsyncGenerator[list[str], None]) -> AsyncGenerator[list[str], None]:
    """`first` (unless None), then `rest`."""
    if first is not None:
        yield first
    async for item in rest:
        yield item


async def _nothing() -> AsyncGenerator[list[str], None]:
    return
    yield  # an async generator that yields nothing


async def _events(response: aiohttp.ClientResponse, host: str) -> AsyncGenerator[list[str], None]:
    """`data:` payloads of an SSE body, a batch per network read: those of the complete lines it brought (one
    await per read, not two per event; under load several events come in one read). Lines are decoded whole,
    so a character split across network writes arrives whole."""
    content = response.content
    pending = bytearray()  # the start of a line whose end has not arrived yet
    try:
        while data := await content.readany():
            pending += data
            end = pending.rfind(b"\n") + 1
            if not end:
                if len(pending) > MAX_LINE_BYTES:
                    raise ValueError("SSE line too long")
                continue
            lines = bytes(pending[:end]).split(b"\n")
            del pending[:end]
            batch: list[str] = []
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    if batch:
                        yield batch
                    await _drain(content)
                    return
                batch.append(payload.decode("utf-8"))
            if batch:
                yield batch
    except TimeoutError as exc:  # aiohttp's read timeout: nothing for first_byte_timeout_seconds
        metrics.CHAT_UPSTREAM_ERRORS.labels(reason="timeout", host=host).inc()
        raise ChatStreamStalledError("chat upstream stream stalled: no chunk in time") from exc
    except (aiohttp.ClientError, ValueError) as exc:  # ValueError: a line too long, or not UTF-8
        metrics.CHAT_UPSTREAM_ERRORS.labels(reason="stream_broken", host=host).inc()
        raise ChatStreamBrokenError(f"chat upstream stream broke: {type(exc).__name__}") from exc
    metrics.CHAT_UPSTREAM_ERRORS.labels(reason="stream_broken", host=host).inc()
    raise ChatStreamBrokenError("chat upstream stream ended without [DONE]")


async def _drain(content: aiohttp.StreamReader) -> None:
    """Read the body's end after [DONE] (usually already received), so that the connection goes back to the
    pool: a response closed before its end closes its connection, and the next call would pay a new TCP and
    TLS handshake before its first token. An upstream that keeps the body open loses the connection instead."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
        async with asyncio.timeout(DRAIN_SECONDS):
            while await content.readany():
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
