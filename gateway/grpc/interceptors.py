"""The one gRPC interceptor: API key check (scope and the key's limits included), the process's in-flight limit
(shared with REST, and counted in the autoscaling gauge), a deadline for unary calls, `GatewayError` -> status
code, latency metric, and the call's cost as trailing metadata `x-request-cost` where a price applied.

Like the REST error handlers in `gateway.errors`, this is the only place errors become gRPC statuses.
Health and reflection calls pass through untouched: probes and tooling carry no API key.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import grpc

from gateway.billing import bill_to
from gateway.errors import GatewayError, UpstreamTimeoutError
from gateway.keys.families import grpc_family
from gateway.keys.gatekeeper import Gatekeeper
from gateway.keys.watchers import WatcherPermits
from gateway.limits import InFlightLimit
from gateway.metrics import GRPC_LATENCY

logger = logging.getLogger(__name__)

# grpc ships no type information: requests, responses and contexts are opaque here.
UnaryBehavior = Callable[[Any, Any], Awaitable[Any]]
StreamBehavior = Callable[[Any, Any], Any]  # returns an async iterator, or a coroutine that uses context.write()

EXEMPT_SERVICES = frozenset(
    {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection", "grpc.reflection.v1.ServerReflection"}
)
# Task watches: permits from the watchers' budget.
WATCH_METHODS = frozenset({"/gateway.v1.Images/WatchTask", "/gateway.v1.Search/WatchReindexTask"})

# GatewayError.status_code (HTTP) -> gRPC status; anything else is INTERNAL.
STATUS_BY_HTTP: Mapping[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    502: grpc.StatusCode.UNKNOWN,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}

_HANDLER_FACTORIES: Mapping[str, Callable[..., grpc.RpcMethodHandler]] = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


def status_for(exc: GatewayError) -> grpc.StatusCode:
    return STATUS_BY_HTTP.get(exc.status_code, grpc.StatusCode.INTERNAL)


def trailers_for(exc: GatewayError) -> tuple[tuple[str, str], ...]:
    retry_after = exc.headers.get("Retry-After")
    return (("retry-after", retry_after),) if retry_after else ()


def service_of(method: str) -> str:
    """`/gateway.v1.Embeddings/Embed` -> `gateway.v1.Embeddings`."""
    return method.lstrip("/").partition("/")[0]


class GatewayInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc is untyped (Any)
    """Wraps every handler's behaviour (all four call kinds) so errors raised while it runs are mapped."""

    def __init__(
        self,
        gatekeeper: Gatekeeper,
        in_flight: InFlightLimit | None = None,
        timeout_seconds: float | None = None,
        watchers: InFlightLimit | None = None,
    ) -> None:
        self._gatekeeper = gatekeeper
        self._in_flight = in_flight
        self._watchers = watchers
        self._timeout = timeout_seconds

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or service_of(method) in EXEMPT_SERVICES:
            return handler
        return self._wrap(handler, method)

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        kind = f"{_arity(handler.request_streaming)}_{_arity(handler.response_streaming)}"
        behavior = getattr(handler, kind)
        wrapped = self._stream(behavior, method) if handler.response_streaming else self._unary(behavior, method)
        return _HANDLER_FACTORIES[kind](
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _unary(self, behavior: UnaryBehavior, method: str) -> UnaryBehavior:
        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with self._guard(method, context):
                deadline = asyncio.timeout(self._timeout)
                try:
                    async with deadline:
                        return await behavior(request, context)
                except TimeoutError:
                    if deadline.expired():  # ours, as the REST deadline: 504 there, DEADLINE_EXCEEDED here
                        raise UpstreamTimeoutError(f"call took longer than {self._timeout:g} s") from None
                    raise

        return unary

    def _stream(self, behavior: StreamBehavior, method: str) -> StreamBehavior:
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async with self._guard(method, context):
                responses = behavior(request, context)
                if inspect.isawaitable(responses):
                    await responses
                    return
                async for response in responses:
                    yield response

        return stream

    @asynccontextmanager
    async def _guard(self, method: str, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        """Authenticate, run the body, turn its exception into a status.

        The latency is observed before the status goes out, so a client that has its answer finds the metric.
        """
        started = time.perf_counter()
        watching = method in WATCH_METHODS
        in_flight = None if watching else self._in_flight
        admitted = False
        watcher: WatcherPermits | None = None  # a watch's: from the watchers' budget and its key's, as REST's streams
        try:
            family = grpc_family(method)
            key = self._gatekeeper.authenticate(_authorization(context), family)
            await self._gatekeeper.admit(key, family)
            cost = bill_to(key)  # this call's task only: the billed services record its usage with the key
            if in_flight is not None:
                if not in_flight.acquire():
                    raise in_flight.overloaded()
                admitted = True
            if watching:
                watcher = WatcherPermits(self._watchers, self._gatekeeper.watchers, key)
                watcher.hold(1)
            yield
        except grpc.aio.AbortError:  # the handler chose its status itself
            _observe(method, context.code() or grpc.StatusCode.UNKNOWN, started)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            _observe(method, grpc.StatusCode.CANCELLED, started)
            raise
        except Exception as exc:
            code, details, trailers = _status_of(exc, method)
            _observe(method, code, started)
            await context.abort(code, details, trailing_metadata=trailers)
        else:
            if (trailer := cost.header()) is not None:  # beside what the servicer set (x-cache, ...)
                context.set_trailing_metadata((*(context.trailing_metadata() or ()), trailer))
            _observe(method, grpc.StatusCode.OK, started)
        finally:
            if admitted and in_flight is not None:
                in_flight.release()
            if watcher is not None:
                watcher.release()


def _status_of(exc: Exception, method: str) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    if isinstance(exc, GatewayError):
        if exc.detail:
            logger.warning("gRPC method %s failed: %s", method, exc)
        return status_for(exc), exc.message, trailers_for(exc)
    logger.error("unhandled error in gRPC method %s", method, exc_info=exc)
    return grpc.StatusCode.INTERNAL, "internal error", ()


def _observe(method: str, code: grpc.StatusCode, started: float) -> None:
    GRPC_LATENCY.labels(method=method, code=code.name).observe(time.perf_counter() - started)


def _arity(streaming: bool) -> str:
    return "stream" if streaming else "unary"


def _authorization(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return str(value)
    return None
