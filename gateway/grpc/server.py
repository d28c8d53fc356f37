"""Builds the gRPC server: gateway.v1 services behind the interceptor, plus standard health and reflection."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gateway.billing import BilledRerank
from gateway.grpc.interceptors import GatewayInterceptor
from gateway.grpc.pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.grpc.search_servicer import SearchServicer
from gateway.grpc.servicer import (
    ChatBackend,
    ChatServicer,
    EmbeddingBackend,
    EmbeddingsServicer,
    ImagesServicer,
    ModelsBackend,
    ModelsServicer,
    RerankServicer,
    VideoBackend,
)
from gateway.keys.gatekeeper import Gatekeeper
from gateway.limits import InFlightLimit
from gateway.services.search import SearchService
from gateway.settings import ServerSettings

EMBEDDINGS_SERVICE: str = gateway_pb2.DESCRIPTOR.services_by_name["Embeddings"].full_name
CHAT_SERVICE: str = gateway_pb2.DESCRIPTOR.services_by_name["Chat"].full_name
IMAGES_SERVICE: str = gateway_pb2.DESCRIPTOR.services_by_name["Images"].full_name
MODELS_SERVICE: str = gateway_pb2.DESCRIPTOR.services_by_name["Models"].full_name
SEARCH_SERVICE: str = gateway_pb2.DESCRIPTOR.services_by_name["Search"].full_name
RERANK_SERVICE: str = gateway_pb2.DESCRIPTOR.services_by_name["Rerank"].full_name

# The generated registration functions are untyped; these names give them the signatures mypy checks.
_add_embeddings: Callable[[EmbeddingsServicer, grpc.aio.Server], None] = (
    gateway_pb2_grpc.add_EmbeddingsServicer_to_server
)
_add_chat: Callable[[ChatServicer, grpc.aio.Server], None] = gateway_pb2_grpc.add_ChatServicer_to_server
_add_images: Callable[[ImagesServicer, grpc.aio.Server], None] = gateway_pb2_grpc.add_ImagesServicer_to_server
_add_models: Callable[[ModelsServicer, grpc.aio.Server], None] = gateway_pb2_grpc.add_ModelsServicer_to_server
_add_search: Callable[[SearchServicer, grpc.aio.Server], None] = gateway_pb2_grpc.add_SearchServicer_to_server
_add_rerank: Callable[[RerankServicer, grpc.aio.Server], None] = gateway_pb2_grpc.add_RerankServicer_to_server


@dataclass
class GrpcServer:
    """A built, not yet started server. `port` is the port actually bound (useful with port 0);
    `services` are the gateway.v1 services it serves, the ones health reports on."""

    server: grpc.aio.Server
    health: health.aio.HealthServicer
    port: int
    services: tuple[str, ...] = (EMBEDDINGS_SERVICE,)
    _stopping: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    async def start(self) -> None:
        """Mark every service SERVING, then accept calls."""
        await self.set_serving(True)
        await self.server.start()

    async def set_serving(self, serving: bool, *, embeddings_only: bool = False) -> None:
        """Flip the health status of the server ("") and of each service, or of the Embeddings service alone
        (while Triton is away the rest still serves)."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in (EMBEDDINGS_SERVICE,) if embeddings_only else (health.OVERALL_HEALTH, *self.services):
            await self.health.set(service, status)

    async def stop(self, grace: float | None) -> None:
        """Report NOT_SERVING for good, then give in-flight calls `grace` seconds to finish. Called again (the
        signal handler and the lifespan both stop it), it waits for the first stop: grpc.aio's own stop must be
        called once."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop(grace))
        await asyncio.shield(self._stopping)

    async def _stop(self, grace: float | None) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


def create_grpc_server(
    backend: EmbeddingBackend,
    gatekeeper: Gatekeeper,
    *,
    host: str,
    port: int,
    chat: ChatBackend | None = None,
    video: VideoBackend | None = None,
    models: ModelsBackend | None = None,
    search: SearchService | None = None,
    rerank: BilledRerank | None = None,
    in_flight: InFlightLimit | None = None,
    watchers: InFlightLimit | None = None,
    timeout_seconds: float | None = None,
    max_message_bytes: int | None = None,
    max_connection_age: tuple[float, float] | None = None,
) -> GrpcServer:
    """Call inside the running event loop that will serve it; then `await GrpcServer.start()`.

    Chat, Images, Models, Search and Rerank are served only when their backend is given; health and reflection list
    what is served.
    `max_message_bytes` (REST's body limit) bounds a request message; gRPC's own default is 4 MiB.
    `max_connection_age` (seconds, grace seconds) sends clients a GOAWAY after that long, so that they reconnect.
    """
    options: list[tuple[str, int]] = []
    if max_message_bytes:
        options.append(("grpc.max_receive_message_length", max_message_bytes))
    if max_connection_age:
        age, grace = max_connection_age
        options.append(("grpc.max_connection_age_ms", int(age * 1000)))
        options.append(("grpc.max_connection_age_grace_ms", int(grace * 1000)))
    server = grpc.aio.server(
        interceptors=[GatewayInterceptor(gatekeeper, in_flight, timeout_seconds, watchers)], options=options
    )
    _add_embeddings(EmbeddingsServicer(backend), server)
    services = [EMBEDDINGS_SERVICE]
    if chat is not None:
        _add_chat(ChatServicer(chat), server)
        services.append(CHAT_SERVICE)
    if video is not None:
        _add_images(ImagesServicer(video), server)
        services.append(IMAGES_SERVICE)
    if models is not None:
        _add_models(ModelsServicer(models), server)
        services.append(MODELS_SERVICE)
    if search is not None:
        _add_search(SearchServicer(search), server)
        services.append(SEARCH_SERVICE)
    if rerank is not None:
        _add_rerank(RerankServicer(rerank), server)
        services.append(RERANK_SERVICE)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((*services, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    bound = server.add_insecure_port(address(host, port))
    return GrpcServer(server=server, health=health_servicer, port=bound, services=tuple(services))


def connection_age(settings: ServerSettings) -> tuple[float, float] | None:
    """GATEWAY_GRPC_MAX_CONNECTION_AGE_SECONDS and its grace; None when 0 (no limit)."""
    if settings.grpc_max_connection_age_seconds <= 0:
        return None
    return settings.grpc_max_connection_age_seconds, settings.grpc_max_connection_age_grace_seconds


def address(host: str, port: int) -> str:
    """`host:port`, with IPv6 literals bracketed (`[::]:50051`)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"
