"""POST /v1/images/generations (202 + task), GET /v1/tasks/{id}, GET /v1/tasks/{id}/events (SSE), DELETE."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Header, Request, Response
from fastapi.responses import StreamingResponse

from gateway.auth import caller_identity
from gateway.billing import BilledVideo
from gateway.protocol.openai import ErrorResponse
from gateway.protocol.video import MAX_IDEMPOTENCY_KEY_CHARS, ImageGenerationRequest, TaskObject
from gateway.routes import include
from gateway.routes.nesting import NestingLimitedRoute
from gateway.routes.task_events import EVENTS_RESPONSE, resume_point, task_events
from gateway.services.video import Task, public_task

router = APIRouter(route_class=NestingLimitedRoute)

ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 413, 429, 503)}


def video(request: Request) -> BilledVideo:
    service: BilledVideo = request.app.state.video
    return service


@router.post("/v1/images/generations", status_code=202, response_model=TaskObject, responses=ERRORS)  # type: ignore[arg-type]
async def create_image_generation(
    body: ImageGenerationRequest,
    request: Request,
    idempotency_key: str | None = Header(
        None, max_length=MAX_IDEMPOTENCY_KEY_CHARS, description="Same key, same task (per API key)."
    ),
) -> Response:
    caller = caller_identity(request.headers.get("authorization"))
    task, created = await video(request).submit(body, idempotency_key=idempotency_key, caller=caller)
    headers = {"Location": f"/v1/tasks/{task.id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    return task_response(task, status_code=202, headers=headers)


@router.get("/v1/tasks/{task_id}", response_model=TaskObject, responses=ERRORS)  # type: ignore[arg-type]
async def get_task(task_id: str, request: Request) -> Response:
    return task_response(await video(request).get(task_id))


@router.delete("/v1/tasks/{task_id}", response_model=TaskObject, responses=ERRORS)  # type: ignore[arg-type]
async def cancel_task(task_id: str, request: Request) -> Response:
    return task_response(await video(request).cancel(task_id))


@router.get("/v1/tasks/{task_id}/events", responses={**EVENTS_RESPONSE, **ERRORS})  # type: ignore[dict-item]
async def watch_task(
    task_id: str,
    request: Request,
    last_event_id: str | None = Header(
        None, description="The id of the last event read: only later changes are sent (a reconnect)."
    ),
) -> StreamingResponse:
    changes = await video(request).watch(task_id, resume_point(last_event_id))
    return task_events(changes, lambda task: public_task(task).model_dump_json())


def task_response(task: Task, *, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = public_task(task).model_dump_json()
    return Response(body, status_code=status_code, media_type="application/json", headers=headers)


def attach_router(app: FastAPI) -> None:
    include(app, router)
