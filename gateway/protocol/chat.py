"""OpenAI chat-completion request (what the gateway validates; every other field passes through)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, StrictBool

from gateway.protocol.base import RequestModel


class ChatMessage(RequestModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(RequestModel):
    """Unknown fields (e.g. `reasoning_effort` for hy3-preview) are kept and sent upstream unchanged."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(description="Upstream model, e.g. hy3-preview.")
    messages: list[ChatMessage] = Field(min_length=1, description="The conversation, oldest first.")
    stream: StrictBool = Field(False, description="Answer as server-sent events `data: {chunk}` ... `data: [DONE]`.")
    max_tokens: int | None = Field(
        None,
        ge=1,
        strict=True,
        description="Most tokens the answer may have; the quota reserves this many for it (512 when unset).",
    )
