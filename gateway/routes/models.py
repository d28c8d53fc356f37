"""GET /v1/models (OpenAI's list shape): the embedding, chat and video models this gateway serves."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request

from gateway.protocol.models import Model, ModelList
from gateway.routes import include
from gateway.routes.embeddings import ERRORS
from gateway.services.models import ModelsService

router = APIRouter()


def models(request: Request) -> ModelsService:
    service: ModelsService = request.app.state.models
    return service


@router.get("/v1/models", response_model=ModelList, responses=ERRORS)  # type: ignore[arg-type]
async def list_models(request: Request) -> ModelList:
    listed = await models(request).list_models()
    return ModelList(data=[Model(id=m.id, created=m.created, owned_by=m.owned_by) for m in listed])


def attach_router(app: FastAPI) -> None:
    include(app, router)
