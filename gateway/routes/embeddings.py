"""POST /v1/embeddings."""

from __future__ import annotations

import base64
import email.message
import functools
import json
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from gateway.protocol.openai import EmbeddingRequest, EmbeddingResponse, ErrorResponse
from gateway.routes.cache_control import cache_allowed
from gateway.services.embeddings import EmbeddingResult, EmbeddingService
from gateway.usage.hooks import record_usage
from gateway.usage.record import Usage


class EmbeddingsRoute(APIRoute):
    """The route FastAPI matches and documents, served without its per-request dependency machinery.

    With one text per request, FastAPI's request handling (two exit stacks, dependency solving, its own
    exception wrapper) costs more CPU than the rest of the request. The body is read and validated here as
    FastAPI would (same content-type rules, same validation errors), and exceptions go up to the app's
    exception handlers as before.
    """

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] not in (self.methods or ()):
            await super().handle(scope, receive, send)  # 405, as FastAPI answers it
            return
        request = Request(scope, receive, send)
        body = parse_body(await request.body(), request.headers.get("content-type"))
        response = await create_embeddings(body, request)
        await response(scope, receive, send)


router = APIRouter(route_class=EmbeddingsRoute)

ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 413, 429, 502, 503, 504)}


def embeddings(request: Request) -> EmbeddingService:
    service: EmbeddingService = request.app.state.embeddings
    return service


@router.post("/v1/embeddings", response_model=EmbeddingResponse, responses=ERRORS)  # type: ignore[arg-type]
async def create_embeddings(body: EmbeddingRequest, request: Request) -> Response:
    texts = [body.input] if isinstance(body.input, str) else body.input
    use_cache = cache_allowed(request)
    result = await embeddings(request).embed(
        texts, model=body.model, truncate=body.truncate, use_cache=use_cache, input_type=body.input_type
    )
    usage = Usage(embedding_texts=len(texts), embedding_tokens=result.prompt_tokens)
    headers = {
        "X-Cache": result.cache,
        "X-Cached-Texts": str(result.cached_texts),
        "X-Truncated-Texts": str(result.truncated_texts),
        **record_usage(request, result.model, usage),
    }
    return Response(response_body(result, body.encoding_format), media_type="application/json", headers=headers)


def parse_body(raw: bytes, content_type: str | None) -> EmbeddingRequest:
    """The body as FastAPI reads a JSON body parameter: JSON only with a JSON content type (its strict
    default), errors located under "body"."""
    data: Any = raw
    if not raw:
        missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
        raise RequestValidationError([missing], body=None)
    if content_type and is_json(content_type):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            error = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error", "input": {}}
            raise RequestValidationError([{**error, "ctx": {"error": exc.msg}}], body=exc.doc) from exc
        except Exception as exc:
            raise HTTPException(status_code=400, detail="There was an error parsing the body") from exc
    try:
        return EmbeddingRequest.model_validate(data, from_attributes=True)
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=data) from exc


@functools.lru_cache(maxsize=64)  # clients send the same few content types
def is_json(content_type: str) -> bool:
    """application/json or application/*+json, parameters aside (as FastAPI reads the header)."""
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def response_body(result: EmbeddingResult, encoding_format: str) -> bytes:
    """The `EmbeddingResponse` as JSON bytes. orjson writes the float32 rows straight from numpy: building
    Python floats and a pydantic model for 64 x 1024 numbers costs more than the rest of a cache hit."""
    if encoding_format == "base64":
        vectors: list[Any] = [base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in result.vectors]
    else:
        vectors = list(result.vectors)
    body = {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
        "model": result.model,
        "usage": {
            "prompt_tokens": result.prompt_tokens,
            "total_tokens": result.prompt_tokens,
            "truncated_texts": result.truncated_texts,
        },
    }
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
