"""A simulator of Tencent HY (Hunyuan) chat as Tencent TokenHub serves it (OpenAI-compatible), for the tests
and the demo.

It speaks the real protocol: `POST /v1/chat/completions` answers an OpenAI `chat.completion` JSON object,
or with `"stream": true` server-sent events `data: {chat.completion.chunk}` ending in `data: [DONE]`;
`GET /v1/models` lists TokenHub's models (`hy3-preview`, ...; any other name, the retired `hunyuan-*` ones
included, answers 400 `model_not_found`); errors are TokenHub's bodies, `{"error": {"message", "type",
"code", "source", "request_id"}}`, 429 and 503 with `Retry-After`. Reasoning models think first, as
TokenHub documents (thinking switch `{"thinking": {"type": "enabled"}}`; hy3-preview's default is off): the
stream carries `delta.reasoning_content` pieces before the content, the completion `message.reasoning_content`,
the usage `completion_tokens_details.reasoning_tokens`. A stream carries its usage only when asked for
(`stream_options: {"include_usage": true}`), as OpenAI's: one last chunk with `choices: []` and the usage. On
request it misbehaves the way the real service does: time to first token, token pacing, a per-second quota, a
concurrency limit, random or scripted failures before the first byte, streams cut off without `[DONE]`, and UTF-8
characters split across two network writes.

`SimulatorConfig` may be changed while the server runs (each request reads it on arrival);
`SimulatorStats` (`app.state.stats`) records what arrived. Times are `time.monotonic()` seconds.

The modules: `config` (what to simulate), `stats` (what it saw), `admission` (key, quota, concurrency and
failures before the first byte), `replies` (the answer and its chunks), `pacing` (how they go out over time),
`errors` (TokenHub's error bodies), `app` (the routes and `create_hunyuan_simulator`).

Standalone: `python -m simulators.hunyuan --host 127.0.0.1 --port 9100 --ttft 0.3 --tps 40 --qps 20`
(`__main__`; `--help` lists the options).
"""

from __future__ import annotations

from simulators.hunyuan.app import create_hunyuan_simulator
from simulators.hunyuan.config import DEFAULT_MODELS, Messages, ReplyFunction, SimulatorConfig
from simulators.hunyuan.errors import SimulatedAPIError
from simulators.hunyuan.replies import PIECE_SIZES, echo_reply, prompt_tokens, reasoning_reply, split_pieces, thinks
from simulators.hunyuan.stats import SimulatorStats

__all__ = [
    "DEFAULT_MODELS",
    "PIECE_SIZES",
    "Messages",
    "ReplyFunction",
    "SimulatedAPIError",
    "SimulatorConfig",
    "SimulatorStats",
    "create_hunyuan_simulator",
    "echo_reply",
    "prompt_tokens",
    "reasoning_reply",
    "split_pieces",
    "thinks",
]
