"""POST /v1/chat/completions (OpenAI shape; `stream: true` answers server-sent events)."""

from __future__ import annotations

from contextlib import AsyncExitStack

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse

from gateway import sse
from gateway.disconnect import unless_disconnected
from gateway.keys.middleware import gatekeeper, request_key
from gateway.protocol.chat import ChatCompletionRequest
from gateway.routes import include
from gateway.routes.cache_control import cache_allowed
from gateway.routes.embeddings import ERRORS
from gateway.routes.event_stream import Opened, OpeningEventStream
from gateway.routes.lean_route import LeanRoute
from gateway.services.chat import CacheResult, ChatService, estimate_tokens, usage_requested
from gateway.usage.hooks import record_usage_durably
from gateway.usage.metering import metered_stream
from gateway.usage.record import chat_usage

router = APIRouter(route_class=LeanRoute)  # a stream's way to its upstream call, without FastAPI's request work


def chat(request: Request) -> ChatService:
    service: ChatService = request.app.state.chat
    return service


@router.post("/v1/chat/completions", responses=ERRORS)  # type: ignore[arg-type]
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    payload = body.model_dump(exclude_unset=True)  # the client's fields only, unknown ones included
    use_cache = cache_allowed(request)
    async with AsyncExitStack() as stack:
        # The key's chat tokens and stream slot: held until the answer (or the stream) ends.
        reservation = await stack.enter_async_context(
            gatekeeper(request).chat(request_key(request), estimate_tokens(payload))
        )
        if body.stream:  # the headers wait for the first chunk: a failure before it is a status, not an event
            held = stack.pop_all()  # the response releases them when it ends

            async def open_stream() -> Opened:
                events, result = await chat(request).stream(payload, use_cache=use_cache)
                metered = metered_stream(
                    events,
                    cached=result.outcome != "miss",
                    usage_requested=usage_requested(payload),
                    reservation=reservation,
                    held=held,
                    record=lambda usage: record_usage_durably(request, body.model, usage),
                )
                return sse.encode_batches(metered), cache_headers(result)

            return OpeningEventStream(open_stream, release=held.aclose)
        completion, result = await unless_disconnected(
            request.receive, chat(request).complete(payload, use_cache=use_cache)
        )
        usage = chat_usage(completion.get("usage"), cached=result.outcome != "miss")
        if completion.get("usage") or result.outcome != "miss":  # without usage the estimate stays charged
            reservation.settle(usage.prompt_tokens + usage.completion_tokens)
        cost = await record_usage_durably(request, body.model, usage)
    return JSONResponse(completion, headers={**cache_headers(result), **cost})


def cache_headers(result: CacheResult) -> dict[str, str]:
    headers: dict[str, str] = {"X-Cache": result.outcome}
    if result.similarity is not None:
        headers["X-Cache-Similarity"] = f"{result.similarity:.4f}"
    return headers


def attach_router(app: FastAPI) -> None:
    include(app, router)
