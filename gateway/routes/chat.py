"""POST /v1/chat/completions (OpenAI shape; `stream: true` answers server-sent events)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack, aclosing
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from gateway import sse
from gateway.disconnect import unless_disconnected
from gateway.keys.gatekeeper import ChatReservation
from gateway.keys.middleware import gatekeeper, request_key
from gateway.protocol.chat import ChatCompletionRequest
from gateway.routes.cache_control import cache_allowed
from gateway.routes.embeddings import ERRORS
from gateway.services.chat import CacheResult, ChatService, estimate_tokens
from gateway.usage.hooks import record_usage
from gateway.usage.record import chat_usage

router = APIRouter()


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
        if body.stream:
            events, result = await chat(request).stream(payload, use_cache=use_cache)
            metered = metered_stream(events, request, body.model, result, reservation, stack.pop_all())
            headers = {**sse.HEADERS, **cache_headers(result)}
            return StreamingResponse(sse.encode_batches(metered), media_type=sse.MEDIA_TYPE, headers=headers)
        completion, result = await unless_disconnected(
            request.receive, chat(request).complete(payload, use_cache=use_cache)
        )
        usage = chat_usage(completion.get("usage"), cached=result.outcome != "miss")
        reservation.settle(usage.prompt_tokens + usage.completion_tokens)
        cost = record_usage(request, body.model, usage)
    return JSONResponse(completion, headers={**cache_headers(result), **cost})


async def metered_stream(
    events: AsyncGenerator[list[str], None],
    request: Request,
    model: str,
    result: CacheResult,
    reservation: ChatReservation,
    held: AsyncExitStack,
) -> AsyncGenerator[list[str], None]:
    """The stream's batches as they come; its usage (in the chunk that has one) is recorded when it ends."""
    usage: dict[str, Any] | None = None
    try:
        async with aclosing(events):
            async for batch in events:
                yield batch
                for chunk in batch:
                    if '"usage"' in chunk and (found := json.loads(chunk).get("usage")):
                        usage = found
        recorded = chat_usage(usage, cached=result.outcome != "miss")
        reservation.settle(recorded.prompt_tokens + recorded.completion_tokens)
        record_usage(request, model, recorded)
    finally:
        await held.aclose()


def cache_headers(result: CacheResult) -> dict[str, str]:
    headers: dict[str, str] = {"X-Cache": result.outcome}
    if result.similarity is not None:
        headers["X-Cache-Similarity"] = f"{result.similarity:.4f}"
    return headers


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
