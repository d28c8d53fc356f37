"""What the simulated Hunyuan answers: the reply text cut into pieces (its tokens), after the reasoning's pieces
when the model thinks, rendered as an OpenAI `chat.completion` (`message.reasoning_content`) or as
`chat.completion.chunk`s (`delta.reasoning_content` first), with usage counted the simulator's way."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from simulators.hunyuan.config import (
    ALWAYS_THINKING,
    SWITCHABLE_THINKING,
    THINKING_BY_DEFAULT,
    Messages,
    ReplyFunction,
    SimulatorConfig,
)

PIECE_SIZES = (1, 2, 3)  # characters per content piece, cycled: the simulator's "tokens"


def _text(content: Any) -> str:
    """The text of a message's content: a string, or a list of `{"type": "text", "text": ...}` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def echo_reply(messages: Messages) -> str:
    """The default answer: an echo of the last user message, then some Chinese (multi-byte in UTF-8)."""
    last = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    return f"Echo: {last}\n你好！这是混元模拟器的回答。"


def reasoning_reply(messages: Messages) -> str:
    """The default thoughts of a thinking answer: about the last user message, in English and Chinese."""
    last = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    return f"The user asks: {last}. 先想一想，再回答。"


def thinks(body: dict[str, Any]) -> bool:
    """Whether the model reasons before answering this request: its thinking switch, else a reasoning effort
    other than none (hy3-preview's slow thinking), else the model's default."""
    model = body["model"]
    if model in ALWAYS_THINKING or model not in SWITCHABLE_THINKING:
        return model in ALWAYS_THINKING
    thinking = body.get("thinking")
    if isinstance(thinking, dict):
        return bool(thinking.get("type") == "enabled")
    if (effort := body.get("reasoning_effort")) is not None:
        return bool(effort != "none")
    return model in THINKING_BY_DEFAULT


def split_pieces(text: str) -> list[str]:
    """Cut `text` into content pieces of 1-3 characters (the simulator's tokens), the same way every time."""
    pieces: list[str] = []
    start = 0
    while start < len(text):
        size = PIECE_SIZES[len(pieces) % len(PIECE_SIZES)]
        pieces.append(text[start : start + size])
        start += size
    return pieces


def prompt_tokens(messages: Messages) -> int:
    """Characters of all message contents / 4, rounded up."""
    return math.ceil(sum(len(_text(m.get("content"))) for m in messages) / 4)


@dataclass(frozen=True)
class Answer:
    """One generated answer, rendered either as a completion or as stream chunks."""

    id: str
    created: int
    model: str
    pieces: list[str]
    finish_reason: str
    prompt_tokens: int
    reasoning: list[str] = field(default_factory=list)  # the thoughts' pieces, generated before `pieces`

    @property
    def piece_count(self) -> int:
        """Pieces generated: reasoning and answer."""
        return len(self.reasoning) + len(self.pieces)

    @property
    def usage(self) -> dict[str, Any]:
        """OpenAI's usage: completion tokens count the reasoning too, detailed in `completion_tokens_details`."""
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.piece_count,
            "total_tokens": self.prompt_tokens + self.piece_count,
        }
        if self.reasoning:
            usage["completion_tokens_details"] = {"reasoning_tokens": len(self.reasoning)}
        return usage

    def completion(self) -> dict[str, Any]:
        message = {"role": "assistant", "content": "".join(self.pieces)}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        choice = {"index": 0, "message": message, "finish_reason": self.finish_reason}
        return {**self._envelope("chat.completion"), "choices": [choice], "usage": self.usage}

    def chunks(self, *, include_usage: bool = False) -> list[dict[str, Any]]:
        """The role chunk, one chunk per reasoning piece, one per content piece, the chunk with finish_reason,
        and, when the request asked for it (`stream_options.include_usage`), OpenAI's usage chunk: no choices,
        only the usage. Without it a stream carries no usage at all, as OpenAI's and TokenHub's do."""
        first = self._chunk({"role": "assistant", "content": ""}, None)
        thoughts = [self._chunk({"reasoning_content": piece}, None) for piece in self.reasoning]
        contents = [self._chunk({"content": piece}, None) for piece in self.pieces]
        finish = self._chunk({}, self.finish_reason)
        if not include_usage:
            return [first, *thoughts, *contents, finish]
        usage = {**self._envelope("chat.completion.chunk"), "choices": [], "usage": self.usage}
        return [first, *thoughts, *contents, finish, usage]

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        return {**self._envelope("chat.completion.chunk"), "choices": [choice]}

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def usage_requested(body: dict[str, Any]) -> bool:
    """Whether a streamed request asked for the usage chunk (`stream_options: {"include_usage": true}`)."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def answer(body: dict[str, Any], config: SimulatorConfig) -> Answer:
    """The answer to a validated chat completion request: the reasoning (if the model thinks) and the configured
    reply, cut at `max_tokens` (which, as OpenAI counts, covers both)."""
    messages: Messages = body["messages"]
    reasoning = _pieces(config.reasoning or reasoning_reply, messages) if thinks(body) else []
    pieces = _pieces(config.reply if config.reply is not None else echo_reply, messages)
    max_tokens = body.get("max_tokens")
    finish_reason = "stop"
    if max_tokens is not None and len(reasoning) + len(pieces) > max_tokens:
        reasoning, pieces = reasoning[:max_tokens], pieces[: max(max_tokens - len(reasoning), 0)]
        finish_reason = "length"
    return Answer(
        id=uuid.uuid4().hex,
        created=int(time.time()),
        model=body["model"],
        pieces=pieces,
        finish_reason=config.finish_reason or finish_reason,
        prompt_tokens=prompt_tokens(messages),
        reasoning=reasoning,
    )


def _pieces(text: str | ReplyFunction, messages: Messages) -> list[str]:
    return split_pieces(text if isinstance(text, str) else text(messages))
