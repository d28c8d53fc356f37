"""Request limits as pure ASGI middleware: body size, in-flight permits (load shedding), deadline."""

from __future__ import annotations

import asyncio

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import metrics
from gateway.auth import PUBLIC_PATHS
from gateway.errors import GatewayError, OverloadedError, PayloadTooLargeError, UpstreamTimeoutError


class LimitsMiddleware:
    """Refuses what would overload the process, with OpenAI-style errors.

    - a body above `max_body_bytes` gets 413 (by Content-Length before reading, or while reading);
    - above `max_in_flight` concurrent requests, 429 with Retry-After at once: queuing without
      bound would only turn overload into timeouts for everyone;
    - a request with no answer after `timeout_seconds` gets 504 and is cancelled (a started stream runs on).
    Health, readiness and metrics are exempt so probes keep answering under load.
    """

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, max_in_flight: int, timeout_seconds: float) -> None:
        if max_body_bytes <= 0 or max_in_flight <= 0 or timeout_seconds <= 0:
            raise ValueError("max_body_bytes, max_in_flight and timeout_seconds must be positive")
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_in_flight = max_in_flight
        self.timeout_seconds = timeout_seconds
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await _answer(self._too_large(declared), scope, receive, send)
            return
        if self.in_flight >= self.max_in_flight:
            metrics.REQUESTS_SHED.inc()
            error = OverloadedError(f"server busy: {self.max_in_flight} requests in flight; retry shortly")
            await _answer(error, scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self._run(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _run(self, scope: Scope, receive: Receive, send: Send) -> None:
        received = 0
        started = False
        deadline = asyncio.timeout(self.timeout_seconds)

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:
                raise self._too_large(received)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                # The deadline bounds the wait for an answer; a stream that has begun is bounded by
                # the upstream's idle timeout instead, however long the answer is.
                deadline.reschedule(None)
            await send(message)

        try:
            async with deadline:
                await self.app(scope, counting_receive, tracking_send)
        except TimeoutError:
            if not started:
                message = f"request took longer than {self.timeout_seconds:g} s"
                await _answer(UpstreamTimeoutError(message), scope, receive, send)

    def _too_large(self, size: int) -> PayloadTooLargeError:
        return PayloadTooLargeError(f"request body of {size} bytes exceeds the limit of {self.max_body_bytes} bytes")


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _answer(error: GatewayError, scope: Scope, receive: Receive, send: Send) -> None:
    await JSONResponse(error.body(), status_code=error.status_code, headers=error.headers)(scope, receive, send)
