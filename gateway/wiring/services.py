"""Every feature opened for one process, billed once (`gateway.billing`), and the gRPC server over them: what
the app's lifespan serves to both transports."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from gateway.billing import BilledChat, BilledEmbeddings, BilledRerank, BilledSearch, BilledVideo
from gateway.grpc.server import GrpcServer, connection_age, create_grpc_server
from gateway.limits import InFlightLimit
from gateway.redis_client import RedisConnection
from gateway.services.embeddings import Embedder
from gateway.services.models import ModelsService
from gateway.services.rerank import RerankService
from gateway.settings import Settings
from gateway.upstreams.triton_chunker import TritonChunker
from gateway.upstreams.triton_reranker import TritonReranker
from gateway.wiring.chat import chat_service
from gateway.wiring.embeddings import embedding_service
from gateway.wiring.gpu import gpu_poller, gpu_protection
from gateway.wiring.keys import KeyServices
from gateway.wiring.search import search_parts
from gateway.wiring.video import video_service


@dataclass(frozen=True)
class Services:
    """What REST and gRPC serve: the same objects for both."""

    embeddings: BilledEmbeddings
    chat: BilledChat
    video: BilledVideo
    search: BilledSearch
    rerank: BilledRerank
    models: ModelsService


@asynccontextmanager
async def open_services(
    settings: Settings, keys: KeyServices, redis: RedisConnection | None, embedder: Embedder | None = None
) -> AsyncIterator[Services]:
    """Each feature from its settings groups; closed in the reverse order on exit."""
    async with AsyncExitStack() as stack:
        gpu = gpu_protection(settings.gpu, settings.triton, embedder)
        embeddings, triton, client = await stack.enter_async_context(
            embedding_service(settings.triton, settings.cache, settings.limits, redis, embedder, gpu)
        )
        if gpu is not None and client is not None:
            await stack.enter_async_context(gpu_poller(settings.gpu, gpu, client))
        reranker = None if client is None else TritonReranker(client, settings.triton)
        chunker = None if client is None else TritonChunker(client, settings.triton)
        rerank = RerankService(reranker, settings.limits, settings.triton.reranker_model, gpu)
        chat = await stack.enter_async_context(
            chat_service(settings.chat, settings.cache, settings.semantic, settings.limits, embeddings, redis)
        )
        video = await stack.enter_async_context(
            video_service(settings.video, settings.tasks, settings.server.public_url, redis)
        )
        store, jobs, chunks = await stack.enter_async_context(
            search_parts(settings.search, settings.tasks, embeddings, redis, chunker, settings.triton.chunker_model)
        )
        yield Services(
            embeddings=BilledEmbeddings(embeddings, keys.usage),
            chat=BilledChat(chat, keys.gatekeeper, keys.usage),
            video=BilledVideo(video, keys.gatekeeper, keys.usage, settings.video.model_path, keys.watch_tokens),
            search=BilledSearch(store, embeddings, settings.limits, keys.usage, jobs, rerank, chunks),
            rerank=BilledRerank(rerank, keys.usage),
            models=ModelsService(
                triton,
                chat,
                configured_chat_models=settings.chat.configured_models(),
                video_model=settings.video.model_path,
            ),
        )


def grpc_server(
    settings: Settings, services: Services, keys: KeyServices, in_flight: InFlightLimit, watchers: InFlightLimit
) -> GrpcServer:
    """The gRPC server over `services`, sharing REST's in-flight and watcher budgets; start it in the loop."""
    return create_grpc_server(
        services.embeddings,
        keys.gatekeeper,
        host=settings.server.host,
        port=settings.server.grpc_port,
        chat=services.chat,
        video=services.video,
        models=services.models,
        search=services.search,
        rerank=services.rerank,
        in_flight=in_flight,
        watchers=watchers,
        timeout_seconds=settings.limits.request_timeout_seconds,
        max_message_bytes=settings.limits.max_body_bytes,
        max_connection_age=connection_age(settings.server),
    )
