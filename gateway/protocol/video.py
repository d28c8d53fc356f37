"""Wire models of the video task API: the generation request and the task object. The route and the model
names keep the OpenAI images shape (`ImageGenerationRequest`, `image.generation.task`) that clients use."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.protocol.base import RequestModel

MIN_SIDE = 256
MAX_SIDE = 2048
MAX_IDEMPOTENCY_KEY_CHARS = 255


class ImageGenerationRequest(RequestModel):
    """`prompt` is required; the size is `width` + `height` or `size` ("1280x720"). Other fields
    (e.g. `seed`, `duration`, `aspect_ratio`, `resolution`) pass through to the upstream model."""

    model_config = ConfigDict(extra="allow")

    prompt: str = Field(min_length=1, description="What to generate.")
    negative_prompt: str | None = Field(None, description="What to avoid.")
    width: int | None = Field(None, ge=MIN_SIDE, le=MAX_SIDE, description="Pixels; needs `height`.")
    height: int | None = Field(None, ge=MIN_SIDE, le=MAX_SIDE, description="Pixels; needs `width`.")
    size: str | None = Field(None, pattern=r"^\d{1,5}x\d{1,5}$", description='"<width>x<height>", e.g. "1280x720".')


class TaskErrorObject(BaseModel):
    code: str = Field(description="timeout | upstream_error | upstream_rejected | cancelled")
    message: str


class TaskObject(BaseModel):
    id: str
    object: Literal["image.generation.task"] = "image.generation.task"
    status: Literal["pending", "processing", "completed", "failed", "cancelled"]
    created_at: int = Field(description="Unix seconds.")
    updated_at: int = Field(description="Unix seconds.")
    completed_at: int | None = Field(None, description="Unix seconds at which the task ended.")
    expires_at: int | None = Field(None, description="After this (Unix seconds) the task is gone (404).")
    urls: list[str] = Field(
        default_factory=list, description="Result file URLs, as the upstream gave them; they are short-lived."
    )
    result: dict[str, Any] | None = Field(None, description="The upstream's result payload, unchanged.")
    error: TaskErrorObject | None = None
