"""What the simulated Hunyuan answers: the reply text cut into pieces (its tokens), rendered as an OpenAI
`chat.completion` or as `chat.completion.chunk`s, with usage counted the simulator's way."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

from simulators.hunyuan.config import Messages, SimulatorConfig

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

    @property
    def usage(self) -> dict[str, int]:
        completion = len(self.pieces)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }

    def completion(self) -> dict[str, Any]:
        message = {"role": "assistant", "content": "".join(self.pieces)}
        choice = {"index": 0, "message": message, "finish_reason": self.finish_reason}
        return {**self._envelope("chat.completion"), "choices": [choice], "usage": self.usage}

    def chunks(self) -> list[dict[str, Any]]:
        """The role chunk, one chunk per content piece, and the last chunk with finish_reason and usage."""
        first = self._chunk({"role": "assistant", "content": ""}, None)
        last = {**self._chunk({}, self.finish_reason), "usage": self.usage}
        return [first, *(self._chunk({"content": piece}, None) for piece in self.pieces), last]

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        return {**self._envelope("chat.completion.chunk"), "choices": [choice]}

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def answer(body: dict[str, Any], config: SimulatorConfig) -> Answer:
    """The answer to a validated chat completion request: the configured reply, cut at `max_tokens`."""
    messages: Messages = body["messages"]
    reply = config.reply if config.reply is not None else echo_reply
    pieces = split_pieces(reply if isinstance(reply, str) else reply(messages))
    max_tokens = body.get("max_tokens")
    finish_reason = "stop"
    if max_tokens is not None and len(pieces) > max_tokens:
        pieces, finish_reason = pieces[:max_tokens], "length"
    return Answer(
        id=uuid.uuid4().hex,
        created=int(time.time()),
        model=body["model"],
        pieces=pieces,
        finish_reason=config.finish_reason or finish_reason,
        prompt_tokens=prompt_tokens(messages),
    )
