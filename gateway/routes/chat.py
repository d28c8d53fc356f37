"""POST /v1/chat/completions (OpenAI shape; `stream: true` answers server-sent events)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from gateway import sse
from gateway.protocol.chat import ChatCompletionRequest
from gateway.routes.embeddings import ERRORS
from gateway.services.chat import ChatService

router = APIRouter()


def chat(request: Request) -> ChatService:
    service: ChatService = request.app.state.chat
    return service


@router.post("/v1/chat/completions", responses=ERRORS)  # type: ignore[arg-type]
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    payload = body.model_dump(exclude_unset=True)  # the client's fields only, unknown ones included
    use_cache = "no-cache" not in request.headers.get("cache-control", "")
    if body.stream:
        events, outcome = await chat(request).stream(payload, use_cache=use_cache)
        headers = {**sse.HEADERS, "X-Cache": outcome}
        return StreamingResponse(sse.encode_stream(events), media_type=sse.MEDIA_TYPE, headers=headers)
    completion, outcome = await chat(request).complete(payload, use_cache=use_cache)
    return JSONResponse(completion, headers={"X-Cache": outcome})


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
