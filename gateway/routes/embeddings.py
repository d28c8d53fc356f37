"""POST /v1/embeddings."""

from __future__ import annotations

import base64

from fastapi import APIRouter, FastAPI, Request, Response

from gateway.protocol.openai import Embedding, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage, ErrorResponse
from gateway.services.embeddings import EmbeddingResult, EmbeddingService

router = APIRouter()

ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 429, 502, 503, 504)}


def embeddings(request: Request) -> EmbeddingService:
    service: EmbeddingService = request.app.state.embeddings
    return service


@router.post("/v1/embeddings", response_model=EmbeddingResponse, responses=ERRORS)  # type: ignore[arg-type]
async def create_embeddings(body: EmbeddingRequest, request: Request) -> Response:
    texts = [body.input] if isinstance(body.input, str) else body.input
    use_cache = "no-cache" not in request.headers.get("cache-control", "")
    result = await embeddings(request).embed(texts, model=body.model, truncate=body.truncate, use_cache=use_cache)
    headers = {"X-Cache": result.cache, "X-Truncated-Texts": str(result.truncated_texts)}
    payload = to_response(result, body.encoding_format)
    return Response(payload.model_dump_json(), media_type="application/json", headers=headers)


def to_response(result: EmbeddingResult, encoding_format: str) -> EmbeddingResponse:
    if encoding_format == "base64":
        vectors: list[list[float] | str] = [
            base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in result.vectors
        ]
    else:
        vectors = list(result.vectors.tolist())
    return EmbeddingResponse(
        data=[Embedding(index=i, embedding=v) for i, v in enumerate(vectors)],
        model=result.model,
        usage=EmbeddingUsage(
            prompt_tokens=result.prompt_tokens,
            total_tokens=result.prompt_tokens,
            truncated_texts=result.truncated_texts,
        ),
    )


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
