"""Request limits: body size, in-flight permits (load shedding, shared with gRPC), deadline (pure ASGI)."""

from __future__ import annotations

import asyncio

from prometheus_client import Gauge
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import metrics
from gateway.auth import PUBLIC_PATHS
from gateway.errors import OverloadedError, PayloadTooLargeError, UpstreamTimeoutError, send_error


class InFlightLimit:
    """Permits for the requests and calls being served, one budget for the process whichever protocol
    they come in on (the REST middleware and the gRPC interceptor share it); `gauge` shows the permits held."""

    def __init__(
        self, maximum: int, *, gauge: Gauge = metrics.HTTP_IN_FLIGHT, held: str = "requests in flight"
    ) -> None:
        if maximum <= 0:
            raise ValueError("the in-flight maximum must be positive")
        self.maximum = maximum
        self.count = 0
        self._gauge = gauge
        self._held = held

    def acquire(self) -> bool:
        """Take a permit, or count a shed request and return False when all are taken."""
        if self.count >= self.maximum:
            metrics.REQUESTS_SHED.inc()
            return False
        self.count += 1
        self._gauge.inc()
        return True

    def release(self) -> None:
        self.count -= 1
        self._gauge.dec()

    def overloaded(self) -> OverloadedError:
        return OverloadedError(f"server busy: {self.maximum} {self._held}; retry shortly")


def watcher_limit(maximum: int) -> InFlightLimit:
    """Permits for task watchers (`GET /v1/tasks/{id}/events`, `.../reindex/{id}/events`, gRPC `WatchTask`,
    `WatchReindexTask`): they wait for minutes and
    cost almost nothing meanwhile, so they have their own budget and gauge, apart from the requests in
    flight that drive the autoscaler and the load shedding."""
    return InFlightLimit(maximum, gauge=metrics.TASK_WATCHERS, held="task watchers")


def is_task_watch(path: str) -> bool:
    """`GET /v1/tasks/{id}/events` or `/v1/collections/{name}/reindex/{id}/events`, a task's event stream."""
    if not path.endswith("/events"):
        return False
    return path.startswith("/v1/tasks/") or (path.startswith("/v1/collections/") and "/reindex/" in path)


class LimitsMiddleware:
    """Refuses what would overload the process, with OpenAI-style errors.

    - a body above `max_body_bytes` gets 413 (by Content-Length before reading, or while reading);
    - above `max_in_flight` concurrent requests, 429 with Retry-After at once: queuing without
      bound would only turn overload into timeouts for everyone (task watchers have their own permits);
    - a request with no answer after `timeout_seconds` gets 504 and is cancelled (a started stream runs on).
    Health, readiness and metrics are exempt so probes keep answering under load.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        in_flight: InFlightLimit,
        watchers: InFlightLimit,
        timeout_seconds: float,
    ) -> None:
        if max_body_bytes <= 0 or timeout_seconds <= 0:
            raise ValueError("max_body_bytes and timeout_seconds must be positive")
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.in_flight = in_flight
        self.watchers = watchers
        self.timeout_seconds = timeout_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await send_error(self._too_large(declared), scope, receive, send)
            return
        permits = self.watchers if is_task_watch(scope["path"]) else self.in_flight
        if not permits.acquire():
            await send_error(permits.overloaded(), scope, receive, send)
            return
        try:
            await self._run(scope, receive, send, counted=declared is None)
        finally:
            permits.release()

    async def _run(self, scope: Scope, receive: Receive, send: Send, *, counted: bool) -> None:
        """`counted`: the body's size is counted as it arrives (a chunked body); the HTTP server delivers no
        more than a declared Content-Length, which was checked already."""
        received = 0
        started = False
        too_large: PayloadTooLargeError | None = None
        deadline = asyncio.timeout(self.timeout_seconds)

        async def counting_receive() -> Message:
            nonlocal received, too_large
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:
                too_large = self._too_large(received)
                raise too_large
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if too_large is not None:
                return  # what the app answers to a body it could not read (FastAPI: 400) becomes the 413 below
            if message["type"] == "http.response.start" and not started:
                started = True
                # The deadline bounds the wait for an answer; a stream that has begun is bounded by
                # the upstream's idle timeout instead, however long the answer is.
                deadline.reschedule(None)
            await send(message)

        try:
            async with deadline:
                await self.app(scope, counting_receive if counted else receive, tracking_send)
        except TimeoutError:
            if not started:
                message = f"request took longer than {self.timeout_seconds:g} s"
                await send_error(UpstreamTimeoutError(message), scope, receive, send)
        except PayloadTooLargeError:
            pass  # answered below
        if too_large is not None and not started:
            await send_error(too_large, scope, receive, send)

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
