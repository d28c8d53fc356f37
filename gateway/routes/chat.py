"""POST /v1/chat/completions (OpenAI shape; `stream: true` answers server-sent events)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse

from gateway import sse
from gateway.billing import BilledChat
from gateway.disconnect import unless_disconnected
from gateway.protocol.chat import ChatCompletionRequest
from gateway.routes import include
from gateway.routes.cache_control import cache_allowed
from gateway.routes.embeddings import ERRORS
from gateway.routes.event_stream import Opened, OpeningEventStream
from gateway.routes.lean_route import LeanRoute
from gateway.services.chat import CacheResult

router = APIRouter(route_class=LeanRoute)  # a stream's way to its upstream call, without FastAPI's request work


def chat(request: Request) -> BilledChat:
    service: BilledChat = request.app.state.chat
    return service


@router.post("/v1/chat/completions", responses=ERRORS)  # type: ignore[arg-type]
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    payload = body.model_dump(exclude_unset=True)  # the client's fields only, unknown ones included
    use_cache = cache_allowed(request)
    if body.stream:  # the headers wait for the first chunk: a failure before it is a status, not an event
        release = None

        async def open_stream() -> Opened:
            nonlocal release
            opened = await chat(request).stream(payload, use_cache=use_cache)
            release = opened.release
            return sse.encode_batches(opened.batches), cache_headers(opened.result)

        async def release_opened() -> None:  # the key's reservation, however the response ends
            if release is not None:
                await release()

        return OpeningEventStream(open_stream, release=release_opened)
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
    include(app, router)
