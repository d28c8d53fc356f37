"""POST /v1/chat/completions (OpenAI shape; `stream: true` answers server-sent events)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from gateway import sse
from gateway.disconnect import unless_disconnected
from gateway.protocol.chat import ChatCompletionRequest
from gateway.routes.cache_control import cache_allowed
from gateway.routes.embeddings import ERRORS
from gateway.services.chat import CacheResult, ChatService

router = APIRouter()


def chat(request: Request) -> ChatService:
    service: ChatService = request.app.state.chat
    return service


@router.post("/v1/chat/completions", responses=ERRORS)  # type: ignore[arg-type]
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    payload = body.model_dump(exclude_unset=True)  # the client's fields only, unknown ones included
    use_cache = cache_allowed(request)
    if body.stream:  # the headers wait for the first chunk: a failure before it is a status, not an event
        events, result = await unless_disconnected(request.receive, chat(request).stream(payload, use_cache=use_cache))
        headers = {**sse.HEADERS, **cache_headers(result)}
        return StreamingResponse(sse.encode_batches(events), media_type=sse.MEDIA_TYPE, headers=headers)
    completion, result = await unless_disconnected(
        request.receive, chat(request).complete(payload, use_cache=use_cache)
    )
    return JSONResponse(completion, headers=cache_headers(result))


def cache_headers(result: CacheResult) -> dict[str, str]:
    headers: dict[str, str] = {"X-Cache": result.outcome}
    if result.similarity is not None:
        headers["X-Cache-Similarity"] = f"{result.similarity:.4f}"
    return headers


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
