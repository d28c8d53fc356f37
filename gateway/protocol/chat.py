"""OpenAI chat-completion request (what the gateway validates; every other field passes through)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, StrictBool

from gateway.protocol.base import RequestModel

# OpenAI's reasoning efforts; TokenHub documents high and low for hy3-preview, other models take others.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class ChatMessage(RequestModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None


class ThinkingSwitch(RequestModel):
    """TokenHub's thinking switch; other fields (e.g. a vendor's budget) pass through."""

    model_config = ConfigDict(extra="allow")

    type: Literal["enabled", "disabled"] = Field(description="'enabled': the model reasons before it answers.")


class ChatCompletionRequest(RequestModel):
    """Unknown fields are kept and sent upstream unchanged."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(description="Upstream model, e.g. hy3-preview.")
    messages: list[ChatMessage] = Field(min_length=1, description="The conversation, oldest first.")
    stream: StrictBool = Field(False, description="Answer as server-sent events `data: {chunk}` ... `data: [DONE]`.")
    max_tokens: int | None = Field(
        None,
        ge=1,
        strict=True,
        description="Most tokens the answer (reasoning included) may have; the quota reserves this many for it "
        "(512 when unset, 2048 when reasoning is asked for).",
    )
    thinking: ThinkingSwitch | None = Field(
        None,
        description='TokenHub\'s thinking switch, e.g. {"type": "enabled"}; unset: the model\'s default '
        "(disabled for hy3-preview). The reasoning streams as `reasoning_content` before the answer.",
    )
    reasoning_effort: ReasoningEffort | None = Field(
        None, description="How much the model reasons (hy3-preview: high or low); passed through."
    )
