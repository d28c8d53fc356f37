"""`create_app(settings)`: the FastAPI app over what `gateway.wiring` builds; its lifespan opens the features and
the gRPC server, and closes them in the reverse order."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from gateway.auth import PUBLIC_PATHS
from gateway.cors import cors_options
from gateway.errors import install_error_handlers
from gateway.limits import InFlightLimit, LimitsMiddleware, watcher_limit
from gateway.observability import RequestContextMiddleware
from gateway.routes import (
    admin,
    callbacks,
    chat,
    docs,
    embeddings,
    health,
    models,
    rerank,
    search,
    task_sockets,
    usage,
    video,
)
from gateway.routes.key_middleware import KeyMiddleware
from gateway.routes.socket_handshake import SocketPolicy
from gateway.services.embeddings import Embedder
from gateway.settings import Settings, deprecated_variables, renamed_variables
from gateway.tracing import tracing_installed
from gateway.wiring.keys import KeyServices
from gateway.wiring.services import grpc_server, open_services
from gateway.wiring.shared import shared_redis

log = logging.getLogger(__name__)

ROUTERS = (embeddings, chat, models, video, task_sockets, search, rerank, callbacks, admin, usage, health, docs)


def create_app(settings: Settings, *, embedder: Embedder | None = None) -> FastAPI:
    """The gateway app. Tests may pass their own `embedder` (anything with the `Embedder` methods)."""
    for old, new in deprecated_variables(renamed_variables()).items():
        log.warning("%s is deprecated and will not be read after this release: set %s instead", old, new)
    # Built with the app, not in its lifespan: the key middleware needs the gatekeeper, whose limits and key
    # store use this connection's circuit like every other Redis user. The lifespan closes it.
    redis = shared_redis(settings.redis)
    keys = KeyServices(
        settings.auth,
        settings.usage,
        redis,
        watchers_per_key=settings.limits.max_task_watchers_per_caller,
        video_key=settings.video.api_key,
    )
    in_flight = InFlightLimit(settings.limits.max_in_flight)  # REST and gRPC: one budget
    watchers = watcher_limit(settings.limits.max_task_watchers)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            await keys.start()
            stack.push_async_callback(keys.aclose)
            if redis is not None:
                stack.push_async_callback(redis.aclose)  # the client closes once every user of it has closed
            services = await stack.enter_async_context(open_services(settings, keys, redis, embedder))
            state = app.state
            state.key_admin, state.usage, state.redis = keys.admin, keys.usage, redis
            state.embeddings, state.chat, state.video = services.embeddings, services.chat, services.video
            state.search, state.rerank, state.models = services.search, services.rerank, services.models
            state.grpc = grpc_server(settings, services, keys, in_flight, watchers)
            await state.grpc.start()
            stack.push_async_callback(state.grpc.stop, settings.server.shutdown_grace_seconds)
            if not keys.resolver.enabled:
                log.warning("no API keys are configured: every route but the admin API is open to anyone")
            log.info("gateway started", extra={"grpc_port": state.grpc.port})
            yield

    app = FastAPI(
        title="AI gateway",
        version="0.2.0",
        description="Embeddings (Triton), chat, video and semantic search behind one OpenAI-style API.",
        lifespan=lifespan,
        docs_url=None,  # gateway.routes.docs serves /docs and /redoc without a CDN
        redoc_url=None,
        # FastAPI's own OpenTelemetry server and endpoint spans (they continue the caller's `traceparent`);
        # metrics are Prometheus (gateway.metrics), and request logs are ours. Off when no tracer is installed
        # (it is installed before the app is built): FastAPI would otherwise look for one at every request.
        telemetry={
            "tracing": tracing_installed(),
            "metrics": False,
            "logs": False,
            "exclude": lambda scope: scope.get("path") in PUBLIC_PATHS,
        },
    )
    install_error_handlers(app)
    for router in ROUTERS:
        router.attach_router(app)
    origins = settings.server.allowed_origins()
    app.state.task_sockets = SocketPolicy(keys.gatekeeper, watchers, frozenset(o.lower() for o in origins))
    app.add_middleware(KeyMiddleware, gatekeeper=keys.gatekeeper)
    app.add_middleware(
        LimitsMiddleware,
        max_body_bytes=settings.limits.max_body_bytes,
        in_flight=in_flight,
        watchers=watchers,
        timeout_seconds=settings.limits.request_timeout_seconds,
    )
    if origins:  # outside the keys and limits: a preflight carries no key, and a refusal needs CORS headers too
        app.add_middleware(CORSMiddleware, **cors_options(origins))
    app.add_middleware(RequestContextMiddleware)  # outermost: every answer gets a request id and is measured
    return app
