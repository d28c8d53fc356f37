"""GET /healthz (alive), /readyz (Triton serving the model), /metrics (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.routes.embeddings import embeddings
from gateway.routes.search import search_service
from gateway.routes.video import video

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready when Triton serves the model. A cache or task store that does not answer is reported but
    does not make the gateway unready: with a shared Redis down, failing readiness would take every
    replica, and so embeddings and chat, out of service for the sake of one feature."""
    service = embeddings(request)
    triton = await service.ready()
    cache = await service.cache_ready()
    await request.app.state.grpc.set_serving(triton)  # gRPC health follows the same check
    checks = {"triton": "ok" if triton else "unavailable"}
    if cache is not None:
        checks["cache"] = "ok" if cache else "degraded"
    checks["tasks"] = "ok" if await video(request).ready() else "unavailable"
    checks["search"] = "ok" if await search_service(request).ready() else "degraded"
    return JSONResponse({"ready": triton, "checks": checks}, status_code=200 if triton else 503)


@router.get("/metrics", response_class=PlainTextResponse)
async def prometheus_metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
