"""`create_app(settings)`: the FastAPI app; its lifespan opens the upstream clients and the gRPC server."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI

from gateway.auth import PUBLIC_PATHS
from gateway.cache.chat import ExactChatCache, TtlPolicy
from gateway.cache.embeddings import EmbeddingCache
from gateway.cache.semantic import (
    EmbeddingMatcher,
    Matcher,
    MemorySemanticStore,
    RedisSemanticStore,
    SemanticIndex,
    SemanticStore,
    SimHashMatcher,
    TextEmbedder,
)
from gateway.cache.stores import build_store
from gateway.errors import install_error_handlers
from gateway.grpc.metered import MeteredChat, MeteredEmbeddings, MeteredSearch, MeteredVideo
from gateway.grpc.server import connection_age, create_grpc_server
from gateway.keys.middleware import KeyMiddleware
from gateway.keys.services import KeyServices
from gateway.limits import InFlightLimit, LimitsMiddleware, watcher_limit
from gateway.observability import RequestContextMiddleware
from gateway.quota import QuotaConfig, build_limiter
from gateway.redis_client import RedisConnection
from gateway.routes import admin, callbacks, chat, docs, embeddings, health, models, search, usage, video
from gateway.search.store import VectorStore
from gateway.search.stores import build_job_store, build_vector_store
from gateway.services.chat import ChatService
from gateway.services.coalescing import CoalescingEmbedder
from gateway.services.embeddings import Embedder, EmbeddingService
from gateway.services.models import ModelsService
from gateway.services.search import SearchService
from gateway.services.search_reindex import ReindexJobs
from gateway.services.video import VideoService
from gateway.services.video_ledger import TaskLedger
from gateway.services.video_runner import VideoTaskRunner
from gateway.services.video_steps import RunnerConfig
from gateway.settings import Settings
from gateway.tasks.stores import build_task_store
from gateway.tracing import tracing_installed
from gateway.upstreams.breaker import BreakerBoard
from gateway.upstreams.fal import FalQueueClient
from gateway.upstreams.fal_history import FalRequestHistory
from gateway.upstreams.llm import LLMClient
from gateway.upstreams.triton import TritonClient
from gateway.upstreams.webhooks import FalWebhookVerifier, WebhookUrls

log = logging.getLogger(__name__)


@asynccontextmanager
async def chat_service(
    settings: Settings, embeddings: EmbeddingService, redis: RedisConnection | None
) -> AsyncIterator[ChatService]:
    """The chat service with its pooled upstream client, answer caches and shared quota."""
    async with AsyncExitStack() as stack:
        llm = await stack.enter_async_context(LLMClient(settings.hunyuan))
        cache = None
        if redis is not None or settings.cache.chat_cache_mb > 0:
            store = build_store(redis, memory_mb=settings.cache.chat_cache_mb)
            ttl = TtlPolicy(
                settings.cache.chat_cache_ttl_base_seconds,
                settings.cache.chat_cache_ttl_per_char_seconds,
                settings.cache.chat_cache_ttl_max_seconds,
            )
            cache = ExactChatCache(store, ttl)
            stack.push_async_callback(cache.aclose)
        semantic = semantic_index(settings, embeddings, redis)
        if semantic is not None:
            stack.push_async_callback(semantic.aclose)
        limiter = build_limiter(QuotaConfig(**settings.hunyuan.quota.model_dump()), redis, name="hunyuan")
        stack.push_async_callback(limiter.aclose)
        yield ChatService(
            llm,
            cache,
            semantic,
            limiter,
            BreakerBoard(settings.hunyuan.breaker_failures, settings.hunyuan.breaker_reset_seconds),
            settings.hunyuan.fallbacks(),
            max_prompt_chars=settings.limits.max_prompt_chars,
            timeout_seconds=settings.hunyuan.total_timeout_seconds,
        )


@asynccontextmanager
async def video_service(settings: Settings, redis: RedisConnection | None) -> AsyncIterator[VideoService]:
    """Video tasks: the task store, the fal queue client, the webhook verifier and this replica's runner."""
    config, tasks = settings.video, settings.tasks
    owner = replica_name()
    async with AsyncExitStack() as stack:
        store = build_task_store(redis, tasks.sqlite_path)
        stack.push_async_callback(store.aclose)
        client = await stack.enter_async_context(
            FalQueueClient(
                config.base_url,
                config.api_key,
                config.model_path,
                connect_timeout_seconds=config.connect_timeout_seconds,
                read_timeout_seconds=config.read_timeout_seconds,
                user_agent=f"ai-gateway ({owner})",  # tells the upstream (and the tests) which replica calls
            )
        )
        history = None
        if config.platform_url:
            history = await stack.enter_async_context(
                FalRequestHistory(
                    config.platform_url,
                    config.api_key,
                    config.model_path,
                    timeout_seconds=config.platform_timeout_seconds,
                    user_agent=f"ai-gateway ({owner})",
                )
            )
        verifier = await stack.enter_async_context(
            FalWebhookVerifier(
                config.webhook_jwks_url,
                tolerance_seconds=config.webhook_tolerance_seconds,
                timeout_seconds=config.webhook_jwks_timeout_seconds,
            )
        )
        quota = build_limiter(
            QuotaConfig(
                requests_per_second=config.submits_per_second,
                max_concurrent=config.max_concurrent_submits,
                max_wait_seconds=config.read_timeout_seconds,
                lease_seconds=tasks.lease_seconds,
            ),
            redis,
            name="pika",
        )
        stack.push_async_callback(quota.aclose)
        public_url = settings.server.public_url
        if public_url is None:
            log.warning("GATEWAY_PUBLIC_URL is not set: image tasks get no webhooks and are polled from the start")
        webhook_urls = WebhookUrls(
            f"{public_url.rstrip('/')}/v1/callbacks/pika" if public_url else None, config.api_key
        )
        runner_config = RunnerConfig(
            callback_grace_seconds=config.callback_grace_seconds,
            poll_initial_seconds=config.poll_initial_seconds,
            poll_max_seconds=config.poll_max_seconds,
            lease_seconds=tasks.lease_seconds,
            scan_interval_seconds=tasks.scan_interval_seconds,
            max_concurrent_submits=config.max_concurrent_submits,
            unknown_submit_wait_seconds=config.unknown_submit_wait_seconds if public_url or history else 0.0,
            lost_job_lookup_seconds=config.lost_job_lookup_seconds,
            submit_call_seconds=config.connect_timeout_seconds + config.read_timeout_seconds,
        )
        ledger = TaskLedger(store, retention_seconds=tasks.retention_seconds)
        runner = VideoTaskRunner(ledger, client, quota, webhook_urls, runner_config, owner=owner, history=history)
        await runner.start()  # also without a key: unfinished tasks still time out and expire
        stack.push_async_callback(runner.aclose)
        yield VideoService(
            ledger,
            runner.submitter,
            runner.reaper,
            verifier,
            webhook_urls,
            configured=client.configured,
            task_timeout_seconds=config.task_timeout_seconds,
            max_prompt_chars=config.max_prompt_chars,
        )


@asynccontextmanager
async def reindex_jobs(
    settings: Settings, redis: RedisConnection | None, store: VectorStore, embeddings: EmbeddingService
) -> AsyncIterator[ReindexJobs]:
    """The re-index jobs of search collections, with their task store; unfinished ones resume now."""
    async with AsyncExitStack() as stack:
        tasks = build_job_store(settings.search, redis)
        stack.push_async_callback(tasks.aclose)
        jobs = ReindexJobs(
            tasks,
            store,
            embeddings,
            owner=replica_name(),
            retention_seconds=settings.tasks.retention_seconds,
            lease_seconds=settings.tasks.lease_seconds,
            scan_interval_seconds=settings.tasks.scan_interval_seconds,
        )
        await jobs.start()
        stack.push_async_callback(jobs.aclose)
        yield jobs


def replica_name() -> str:
    """This process's name on task leases: unique even for replicas sharing a host."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def shared_redis(settings: Settings) -> RedisConnection | None:
    """The one Redis connection (client and circuit) of the caches, quotas, task store, keys and usage record."""
    url, config = settings.redis.url_value(), settings.redis
    if url is None:
        return None
    return RedisConnection(url, timeout_seconds=config.timeout_seconds, backoff_seconds=config.backoff_seconds)


def semantic_index(settings: Settings, embedder: TextEmbedder, redis: RedisConnection | None) -> SemanticIndex | None:
    """The semantic index `settings.semantic` asks for, or None; an embedding matcher gets its vectors from
    `embedder` (the embedding service), so the cache never reaches into the services."""
    config = settings.semantic
    if config.matcher == "off":
        return None
    matcher: Matcher = SimHashMatcher() if config.matcher == "simhash" else EmbeddingMatcher(embedder)
    store: SemanticStore = RedisSemanticStore(redis) if redis is not None else MemorySemanticStore()
    return SemanticIndex(store, matcher, config.threshold, max_entries_per_context=config.max_entries_per_context)


def create_app(settings: Settings, *, embedder: Embedder | None = None) -> FastAPI:
    """The gateway app. Tests may pass their own `embedder` (anything with the `Embedder` methods)."""
    # Built with the app, not in its lifespan: the key middleware needs the gatekeeper, whose limits and key
    # store use this connection's circuit like every other Redis user. The lifespan closes it.
    redis = shared_redis(settings)
    keys = KeyServices(settings, redis)
    in_flight = InFlightLimit(settings.limits.max_in_flight)  # REST and gRPC: one budget
    watchers = watcher_limit(settings.limits.max_task_watchers)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            await keys.start()
            stack.push_async_callback(keys.aclose)
            app.state.gatekeeper, app.state.key_admin, app.state.usage = keys.gatekeeper, keys.admin, keys.usage
            app.state.video_model = settings.video.model_path  # what video usage is recorded and priced under
            triton = embedder
            if triton is None:
                client = TritonClient(settings.triton)
                stack.push_async_callback(client.aclose)
                triton = CoalescingEmbedder(client, max_in_flight=settings.triton.max_in_flight_calls)
            app.state.redis = redis
            if redis is not None:
                stack.push_async_callback(redis.aclose)  # the client closes once every user of it has closed
            cache = None
            if redis is not None or settings.cache.embedding_cache_mb > 0:
                cache = EmbeddingCache(
                    build_store(redis, memory_mb=settings.cache.embedding_cache_mb),
                    ttl_seconds=settings.cache.embedding_cache_ttl_seconds,
                )
                stack.push_async_callback(cache.aclose)
            service = EmbeddingService(triton, cache, settings.limits)
            app.state.embeddings = service
            app.state.chat = await stack.enter_async_context(chat_service(settings, service, redis))
            app.state.video = await stack.enter_async_context(video_service(settings, redis))
            vector_store = build_vector_store(settings.search, redis)  # opens nothing yet: a bad folder degrades search
            jobs = None
            if vector_store is not None:
                stack.push_async_callback(vector_store.aclose)
                jobs = await stack.enter_async_context(reindex_jobs(settings, redis, vector_store, service))
            else:
                log.info("semantic search is disabled (SEARCH_ENABLED=false)")
            app.state.search = SearchService(vector_store, service, settings.limits, jobs)
            app.state.models = ModelsService(
                triton,
                app.state.chat,
                configured_chat_models=settings.hunyuan.configured_models(),
                video_model=settings.video.model_path,
            )
            grpc_server = create_grpc_server(
                MeteredEmbeddings(service, keys.usage),
                keys.gatekeeper,
                host=settings.server.host,
                port=settings.server.grpc_port,
                chat=MeteredChat(app.state.chat, keys.gatekeeper, keys.usage),
                video=MeteredVideo(app.state.video, keys.gatekeeper, keys.usage, settings.video.model_path),
                models=app.state.models,
                search=MeteredSearch(vector_store, service, settings.limits, keys.usage, jobs),
                in_flight=in_flight,
                watchers=watchers,
                timeout_seconds=settings.limits.request_timeout_seconds,
                max_message_bytes=settings.limits.max_body_bytes,
                max_connection_age=connection_age(settings.server),
            )
            await grpc_server.start()
            app.state.grpc = grpc_server
            stack.push_async_callback(grpc_server.stop, settings.server.shutdown_grace_seconds)
            if not keys.resolver.enabled:
                log.warning("no API keys are configured: every route but the admin API is open to anyone")
            log.info("gateway started", extra={"grpc_port": grpc_server.port})
            yield

    app = FastAPI(
        title="AI gateway",
        version="0.1.0",
        description="Embeddings (Triton), chat and images behind one OpenAI-style API.",
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
    embeddings.attach_router(app)
    chat.attach_router(app)
    models.attach_router(app)
    video.attach_router(app)
    search.attach_router(app)
    callbacks.attach_router(app)
    admin.attach_router(app)
    usage.attach_router(app)
    health.attach_router(app)
    docs.attach_router(app)
    app.add_middleware(KeyMiddleware, gatekeeper=keys.gatekeeper)
    app.add_middleware(
        LimitsMiddleware,
        max_body_bytes=settings.limits.max_body_bytes,
        in_flight=in_flight,
        watchers=watchers,
        timeout_seconds=settings.limits.request_timeout_seconds,
    )
    app.add_middleware(RequestContextMiddleware)  # outermost: every answer gets a request id and is measured
    return app
