"""OpenAI wire models for `GET /v1/models`. No logic."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Model(BaseModel):
    id: str = Field(description="The name to send as `model`.")
    object: Literal["model"] = "model"
    created: int = Field(description="Unix seconds the model was published; 0 when not known.")
    owned_by: str = Field(description="The organisation that publishes it, e.g. 'tencent', 'BAAI', 'fal-ai'.")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]
