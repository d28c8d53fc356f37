"""POST /v1/callbacks/video/{task_id}: fal's webhook for a video job, authenticated by its signature.

`/v1/callbacks/pika/{task_id}` is the same route under its name before 0.2, kept for one release: jobs submitted by
an older replica during a rolling upgrade carry it in their webhook URL.

This route takes no API key (fal cannot send one); `ApiKeyMiddleware` exempts `CALLBACK_PREFIX` and
the service checks the `token` that the job's webhook URL carries (`gateway.upstreams.webhooks.WebhookUrls`),
then fal's Ed25519 signature over the raw body.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse

from gateway.protocol.openai import ErrorResponse
from gateway.routes import include
from gateway.routes.video import video

router = APIRouter()

ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 503)}


@router.post("/v1/callbacks/video/{task_id}", responses=ERRORS)  # type: ignore[arg-type]
@router.post("/v1/callbacks/pika/{task_id}", responses=ERRORS, deprecated=True)  # type: ignore[arg-type]
async def video_callback(
    task_id: str,
    request: Request,
    token: str = Query("", description="The token of the webhook URL the job was submitted with."),
    attempt: int | None = Query(None, description="The submit attempt the job's webhook URL was minted for."),
) -> JSONResponse:
    body = await request.body()
    task = await video(request).service.handle_callback(task_id, request.headers, body, token, attempt)
    return JSONResponse({"received": True, "task_id": task.id, "status": task.state.value})


def attach_router(app: FastAPI) -> None:
    include(app, router)
