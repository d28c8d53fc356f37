"""POST /v1/rerank."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, Request

from gateway.billing import BilledRerank
from gateway.protocol.openai import ErrorResponse
from gateway.protocol.rerank import (
    RerankDocumentOut,
    RerankRequest,
    RerankResponse,
    RerankResultObject,
    RerankUsage,
)
from gateway.routes import include

router = APIRouter(tags=["rerank"])

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 413, 429, 502, 503, 504)
}


@router.post("/v1/rerank", response_model=RerankResponse, response_model_exclude_none=True, responses=ERRORS)
async def rerank(body: RerankRequest, request: Request) -> RerankResponse:
    service: BilledRerank = request.app.state.rerank
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    result = await service.rerank(body.query, texts, top_n=body.top_n, model=body.model)
    results = [
        RerankResultObject(
            index=r.index,
            relevance_score=r.relevance_score,
            document=RerankDocumentOut(text=texts[r.index]) if body.return_documents else None,
        )
        for r in result.results
    ]
    return RerankResponse(
        model=result.model, results=results, usage=RerankUsage(prompt_tokens=result.tokens, total_tokens=result.tokens)
    )


def attach_router(app: FastAPI) -> None:
    include(app, router)
