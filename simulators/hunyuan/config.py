"""How the simulated Hunyuan (TokenHub's OpenAI-compatible API) behaves: the models it serves and its faults."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# TokenHub's chat models (its model list); the retired hunyuan-* names answer as unknown models there too.
DEFAULT_MODELS = (
    "hy3-preview",
    "hunyuan-2.0-thinking-20251109",
    "hunyuan-2.0-instruct-20251111",
    "hunyuan-role-latest",
    "hy-mt2-pro",
    "deepseek-v4-flash",
    "deepseek-v4-pro",
    "deepseek-v3.2",
    "glm-5",
    "glm-5.1",
    "kimi-k2.5",
    "kimi-k2.6",
    "minimax-m2.5",
    "minimax-m2.7",
)

# Who thinks before answering (TokenHub's "深度思考" page, cloud.tencent.com product 1823 doc 131208): the
# `thinking` switch ({"type": "enabled" | "disabled"}) turns it on or off; without it, THINKING_BY_DEFAULT think,
# hy3-preview and deepseek-v3.2 do not. ALWAYS_THINKING cannot be switched off; the other models never think.
THINKING_BY_DEFAULT = frozenset({"deepseek-v4-flash", "deepseek-v4-pro", "glm-5", "glm-5.1", "kimi-k2.5", "kimi-k2.6"})
ALWAYS_THINKING = frozenset({"hunyuan-2.0-thinking-20251109", "minimax-m2.5", "minimax-m2.7"})
SWITCHABLE_THINKING = THINKING_BY_DEFAULT | {"hy3-preview", "deepseek-v3.2"}

Messages = list[dict[str, Any]]
ReplyFunction = Callable[[Messages], str]


@dataclass
class SimulatorConfig:
    """How the simulated TokenHub behaves. Mutable at run time: each request reads it when it arrives."""

    api_key: str | None = None  # the only accepted `Authorization: Bearer` key; None accepts any or none
    models: tuple[str, ...] = DEFAULT_MODELS  # other model names answer 400 model_not_found
    ttft_seconds: float = 0.0  # delay before the first chunk (streaming) or before generation (non-streaming)
    tokens_per_second: float | None = None  # pieces per second, each on its own deadline; None: all at once
    qps_quota: int | None = None  # requests let through per rolling 1 s window (by arrival); beyond: 429
    max_concurrency: int | None = None  # requests answered at once; beyond: 429 concurrency_limit_exceeded
    error_rate: float = 0.0  # probability of a 500 before the first byte
    rate_limit_rate: float = 0.0  # probability of a 429 before the first byte
    seed: int = 0  # seeds the random failures (changing it reseeds)
    fail_next: list[int] = field(default_factory=list)  # statuses for the next requests, popped in order (200: pass)
    drop_stream_after_chunks: int | None = None  # close streams abruptly after N chunks, never sending [DONE]
    drop_streams: int | None = None  # how many of the next streams drop so (counted down); None: every one
    split_utf8: bool = False  # split each multi-byte character's bytes across two network writes
    split_pause_seconds: float = 0.02  # pause between the two halves, so the client reads them separately
    reply: str | ReplyFunction | None = None  # fixed text or messages -> text; None: echo of the last user message
    reasoning: str | ReplyFunction | None = None  # a thinking answer's thoughts, as `reply`; None: a fixed one
    finish_reason: str | None = None  # overrides "stop" / "length"
