"""POST /v1/embeddings."""

from __future__ import annotations

import base64
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request, Response

from gateway.billing import BilledEmbeddings
from gateway.protocol.openai import EmbeddingRequest, EmbeddingResponse, ErrorResponse
from gateway.routes import include
from gateway.routes.cache_control import cache_allowed
from gateway.routes.lean_route import LeanRoute
from gateway.services.embeddings import EmbeddingResult

router = APIRouter(route_class=LeanRoute)

ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 413, 429, 502, 503, 504)}


def embeddings(request: Request) -> BilledEmbeddings:
    service: BilledEmbeddings = request.app.state.embeddings
    return service


@router.post("/v1/embeddings", response_model=EmbeddingResponse, responses=ERRORS)  # type: ignore[arg-type]
async def create_embeddings(body: EmbeddingRequest, request: Request) -> Response:
    texts = [body.input] if isinstance(body.input, str) else body.input
    use_cache = cache_allowed(request)
    result = await embeddings(request).embed(
        texts, model=body.model, truncate=body.truncate, use_cache=use_cache, input_type=body.input_type
    )
    headers = {
        "X-Cache": result.cache,
        "X-Cached-Texts": str(result.cached_texts),
        "X-Truncated-Texts": str(result.truncated_texts),
    }
    return Response(response_body(result, body.encoding_format), media_type="application/json", headers=headers)


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
    include(app, router)
