"""GET /healthz (alive), /readyz (ready to serve; degraded parts reported), /metrics (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.routes import include
from gateway.routes.embeddings import embeddings
from gateway.routes.search import search_service
from gateway.routes.video import video

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready once started. A dependency that does not answer is reported but does not make the gateway
    unready: with Triton or a shared Redis down, failing readiness would take every replica, and so chat,
    video and cached embeddings, out of service for the sake of one feature. Without Triton, uncached
    embeddings answer 503 (`triton unavailable`); gRPC health reports the Embeddings service NOT_SERVING. A GPU
    that is degraded or throttled is reported as `gpu: degraded` (`unknown` while no GPU metrics are read), still
    200: every replica reads the same GPUs, and would go unready at once."""
    service = embeddings(request).service
    triton = await service.ready()
    cache = await service.cache_ready()
    await request.app.state.grpc.set_serving(triton, embeddings_only=True)
    checks = {"triton": "ok" if triton else "degraded"}
    if cache is not None:
        checks["cache"] = "ok" if cache else "degraded"
    gpu = service.gpu_readiness()
    if gpu is not None:
        checks["gpu"] = gpu
    checks["tasks"] = "ok" if await video(request).service.ready() else "unavailable"
    redis = request.app.state.redis  # its last known state: readiness never waits on Redis
    if redis is not None:
        checks["redis"] = "ok" if redis.known_up() else "degraded"
    checks["search"] = await search_service(request).readiness()
    return JSONResponse({"ready": True, "checks": checks})


@router.get("/metrics", response_class=PlainTextResponse)
async def prometheus_metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def attach_router(app: FastAPI) -> None:
    include(app, router)
