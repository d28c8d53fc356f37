"""A simulator of Tencent Hunyuan's OpenAI-compatible chat API, for the tests and the demo.

It speaks the real protocol: `POST /v1/chat/completions` answers an OpenAI `chat.completion` JSON object,
or with `"stream": true` server-sent events `data: {chat.completion.chunk}` ending in `data: [DONE]`;
`GET /v1/models` lists the models; errors are OpenAI-style `{"error": {"message", "type", "code"}}` bodies,
429 and 503 with `Retry-After`. On request it misbehaves the way the real service does: time to first
token, token pacing, a per-second quota, a concurrency limit, random or scripted failures before the first
byte, streams cut off without `[DONE]`, and UTF-8 characters split across two network writes.

`SimulatorConfig` may be changed while the server runs (each request reads it on arrival);
`SimulatorStats` (`app.state.stats`) records what arrived. Times are `time.monotonic()` seconds.

Standalone: `python -m simulators.hunyuan --host 127.0.0.1 --port 9100 --ttft 0.3 --tps 40 --qps 20`
(`main()` below; `--help` lists the options).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import copy
import json
import math
import random
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

DEFAULT_MODELS = (
    "hunyuan-turbos-latest",
    "hunyuan-t1-latest",
    "hunyuan-turbo",
    "hunyuan-large",
    "hunyuan-pro",
    "hunyuan-standard",
    "hunyuan-standard-256K",
    "hunyuan-lite",
    "hunyuan-role",
    "hunyuan-functioncall",
)
PIECE_SIZES = (1, 2, 3)  # characters per content piece, cycled: the simulator's "tokens"

Messages = list[dict[str, Any]]
ReplyFunction = Callable[[Messages], str]


@dataclass
class SimulatorConfig:
    """How the simulated Hunyuan behaves. Mutable at run time: each request reads it when it arrives."""

    api_key: str | None = None  # the only accepted `Authorization: Bearer` key; None accepts any or none
    models: tuple[str, ...] = DEFAULT_MODELS  # other model names answer 400 model_not_found
    ttft_seconds: float = 0.0  # delay before the first chunk (streaming) or before generation (non-streaming)
    tokens_per_second: float | None = None  # pacing of content pieces; None sends them at once
    qps_quota: int | None = None  # requests let through per rolling 1 s window (by arrival); beyond: 429
    max_concurrency: int | None = None  # requests answered at once; beyond: 429 concurrency_limit_exceeded
    error_rate: float = 0.0  # probability of a 500 before the first byte
    rate_limit_rate: float = 0.0  # probability of a 429 before the first byte
    seed: int = 0  # seeds the random failures (changing it reseeds)
    fail_next: list[int] = field(default_factory=list)  # statuses for the next requests, popped in order (200: pass)
    drop_stream_after_chunks: int | None = None  # close streams abruptly after N chunks, never sending [DONE]
    split_utf8: bool = False  # split each multi-byte character's bytes across two network writes
    split_pause_seconds: float = 0.02  # pause between the two halves, so the client reads them separately
    reply: str | ReplyFunction | None = None  # fixed text or messages -> text; None: echo of the last user message
    finish_reason: str | None = None  # overrides "stop" / "length"


@dataclass
class SimulatorStats:
    """What the simulator saw. Written by the server's event loop; read it from tests as a snapshot."""

    requests_total: int = 0  # chat completion requests that arrived, rejected ones included
    requests_by_model: Counter[str] = field(default_factory=Counter)
    arrival_times: list[float] = field(default_factory=list)  # every chat completion request
    accepted_times: list[float] = field(default_factory=list)  # requests the QPS quota let through
    responses_by_status: Counter[int] = field(default_factory=Counter)
    in_flight: int = 0  # admitted requests not yet answered in full
    max_in_flight: int = 0
    streams_open: int = 0
    streams_completed: int = 0  # ended with [DONE]
    streams_cancelled: int = 0  # the client went away before the end
    streams_dropped: int = 0  # cut off on purpose (`drop_stream_after_chunks`)
    last_request: dict[str, Any] | None = None  # the last JSON body received, unknown fields included
    last_headers: dict[str, str] = field(default_factory=dict)
    client_addresses: set[str] = field(default_factory=set)  # host:port of each connection requests came on

    @property
    def rate_limited(self) -> int:
        """429 answers sent, for any reason."""
        return self.responses_by_status[429]

    def max_requests_in_any_window(self, seconds: float = 1.0, *, accepted_only: bool = False) -> int:
        """The most requests whose arrival times fall in one window (t - seconds, t]."""
        times = sorted(self.accepted_times if accepted_only else self.arrival_times)
        counts = (i + 1 - bisect.bisect_right(times, t - seconds, 0, i + 1) for i, t in enumerate(times))
        return max(counts, default=0)

    def admit(self) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def close_stream(self, outcome: str) -> None:
        self.in_flight -= 1
        self.streams_open -= 1
        if outcome == "completed":
            self.streams_completed += 1
        elif outcome == "dropped":
            self.streams_dropped += 1
        else:
            self.streams_cancelled += 1


_ERROR_KINDS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("authentication_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    500: ("server_error", "internal_error"),
    502: ("server_error", "bad_gateway"),
    503: ("server_error", "service_unavailable"),
    504: ("server_error", "timeout"),
}


class SimulatedAPIError(Exception):
    """An error the simulator answers with an OpenAI-style body (before any byte of a success)."""

    def __init__(self, status_code: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type, default_code = _ERROR_KINDS.get(status_code, ("api_error", "error"))
        self.code = code or default_code

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": None, "code": self.code}}
        headers = {"Retry-After": "1"} if self.status_code in (429, 503) else None
        return JSONResponse(body, status_code=self.status_code, headers=headers)


class _StreamDroppedError(Exception):
    """Raised inside a stream to cut the connection without [DONE]."""


class _Simulator:
    """The live config, the stats and the admission state of one simulator app."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.stats = SimulatorStats()
        self._window: deque[float] = deque()
        self._seed = config.seed
        self._random = random.Random(config.seed)

    def record(
        self, body: dict[str, Any] | None, headers: Mapping[str, str], now: float, client: str | None = None
    ) -> None:
        self.stats.requests_total += 1
        if client is not None:
            self.stats.client_addresses.add(client)
        self.stats.arrival_times.append(now)
        self.stats.last_request = body
        self.stats.last_headers = dict(headers)
        if body is not None and isinstance(body.get("model"), str):
            self.stats.requests_by_model[body["model"]] += 1

    def authenticate(self, authorization: str | None) -> None:
        expected = self.config.api_key
        if expected is not None and authorization != f"Bearer {expected}":
            raise SimulatedAPIError(401, "missing or wrong API key in the Authorization: Bearer header")

    def admit(self, now: float) -> None:
        """Raise the failure due before the first byte, or count the request in flight."""
        config = self.config
        if config.fail_next and (status := config.fail_next.pop(0)) != 200:
            raise SimulatedAPIError(status, f"scripted failure {status} (fail_next)")
        self._enforce_quota(config.qps_quota, now)
        if config.max_concurrency is not None and self.stats.in_flight >= config.max_concurrency:
            message = f"{self.stats.in_flight} requests in flight >= concurrency limit {config.max_concurrency}"
            raise SimulatedAPIError(429, message, "concurrency_limit_exceeded")
        self._random_failure(config)
        self.stats.admit()

    def _enforce_quota(self, quota: int | None, now: float) -> None:
        while self._window and self._window[0] <= now - 1.0:
            self._window.popleft()
        if quota is not None and len(self._window) >= quota:
            raise SimulatedAPIError(429, f"{len(self._window)} requests in the last second >= quota {quota} QPS")
        self._window.append(now)
        self.stats.accepted_times.append(now)

    def _random_failure(self, config: SimulatorConfig) -> None:
        if config.seed != self._seed:
            self._seed, self._random = config.seed, random.Random(config.seed)
        if self._random.random() < config.rate_limit_rate:
            raise SimulatedAPIError(429, "rate limited (simulated rate_limit_rate)")
        if self._random.random() < config.error_rate:
            raise SimulatedAPIError(500, "internal error (simulated error_rate)")


def _validated(body: dict[str, Any] | None, models: Sequence[str]) -> dict[str, Any]:
    """The body if it is a chat completion request the real service would accept; else a 400."""
    if body is None:
        raise SimulatedAPIError(400, "request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise SimulatedAPIError(400, f"model must be a string, got {model!r}")
    if model not in models:
        raise SimulatedAPIError(
            400, f"model {model!r} is not supported; expected one of {list(models)}", "model_not_found"
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise SimulatedAPIError(400, "messages must be a non-empty list of objects with a role")
    if not isinstance(body.get("stream", False), bool):
        raise SimulatedAPIError(400, f"stream must be a boolean, got {body['stream']!r}")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise SimulatedAPIError(400, f"max_tokens must be a positive integer, got {max_tokens!r}")
    return body


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
class _Answer:
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


def _answer(body: dict[str, Any], config: SimulatorConfig) -> _Answer:
    messages: Messages = body["messages"]
    reply = config.reply if config.reply is not None else echo_reply
    pieces = split_pieces(reply if isinstance(reply, str) else reply(messages))
    max_tokens = body.get("max_tokens")
    finish_reason = "stop"
    if max_tokens is not None and len(pieces) > max_tokens:
        pieces, finish_reason = pieces[:max_tokens], "length"
    return _Answer(
        id=uuid.uuid4().hex,
        created=int(time.time()),
        model=body["model"],
        pieces=pieces,
        finish_reason=config.finish_reason or finish_reason,
        prompt_tokens=prompt_tokens(messages),
    )


def _piece_seconds(config: SimulatorConfig) -> float:
    return 1.0 / config.tokens_per_second if config.tokens_per_second else 0.0


def _sse(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def _split_point(data: bytes) -> int | None:
    """The index just after the lead byte of the first multi-byte UTF-8 character, if any."""
    return next((index + 1 for index, byte in enumerate(data) if byte >= 0xC0), None)


def _writes(event: bytes, split_utf8: bool) -> list[bytes]:
    """One network write per event, or two with a character cut in half when `split_utf8` is on."""
    cut = _split_point(event) if split_utf8 else None
    return [event] if cut is None else [event[:cut], event[cut:]]


async def _events(answer: _Answer, config: SimulatorConfig) -> AsyncGenerator[bytes, None]:
    """The stream: role chunk and first piece after the TTFT, the other pieces paced, then [DONE]."""
    await asyncio.sleep(config.ttft_seconds)
    drop_after = config.drop_stream_after_chunks
    for index, chunk in enumerate(answer.chunks()):
        if drop_after is not None and index >= drop_after:
            raise _StreamDroppedError
        if 1 < index <= len(answer.pieces):
            await asyncio.sleep(_piece_seconds(config))
        for part, write in enumerate(_writes(_sse(chunk), config.split_utf8)):
            if part:  # let the first half reach the client on its own
                await asyncio.sleep(config.split_pause_seconds)
            yield write
    if drop_after is not None:
        raise _StreamDroppedError
    yield b"data: [DONE]\n\n"


class _SimulatedStream(StreamingResponse):
    """An SSE response that records how it ended and closes its generator as soon as it does."""

    def __init__(self, events: AsyncGenerator[bytes, None], stats: SimulatorStats) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._events = events
        self._stats = stats
        self._completed = False

    async def stream_response(self, send: Send) -> None:
        await super().stream_response(send)
        self._completed = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._stats.streams_open += 1
        outcome = "cancelled"  # a client disconnect cancels the stream and returns quietly
        try:
            await super().__call__(scope, receive, send)
            outcome = "completed" if self._completed else outcome
        except _StreamDroppedError:
            # Returning without the final body makes uvicorn close the connection mid-stream.
            outcome = "dropped"
        finally:
            self._stats.close_stream(outcome)
            with anyio.CancelScope(shield=True):
                await self._events.aclose()


router = APIRouter()


def _simulator(request: Request) -> _Simulator:
    simulator: _Simulator = request.app.state.simulator
    return simulator


async def _json_body(request: Request) -> dict[str, Any] | None:
    try:
        body = json.loads(await request.body())
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


async def _complete(answer: _Answer, config: SimulatorConfig, stats: SimulatorStats) -> JSONResponse:
    """A non-streaming answer arrives when a stream of it would have ended."""
    try:
        await asyncio.sleep(config.ttft_seconds + _piece_seconds(config) * max(len(answer.pieces) - 1, 0))
    finally:
        stats.in_flight -= 1
    return JSONResponse(answer.completion())


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    simulator = _simulator(request)
    now = time.monotonic()
    body = await _json_body(request)
    client = f"{request.client.host}:{request.client.port}" if request.client else None
    simulator.record(body, request.headers, now, client)
    simulator.authenticate(request.headers.get("authorization"))
    payload = _validated(body, simulator.config.models)
    config = copy.copy(simulator.config)  # what this request runs with, whatever a test changes meanwhile
    answer = _answer(payload, config)
    simulator.admit(now)
    simulator.stats.responses_by_status[200] += 1
    if payload.get("stream"):
        return _SimulatedStream(_events(answer, config), simulator.stats)
    return await _complete(answer, config, simulator.stats)


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    simulator = _simulator(request)
    simulator.authenticate(request.headers.get("authorization"))
    data = [{"id": model, "object": "model", "created": 0, "owned_by": "tencent"} for model in simulator.config.models]
    return JSONResponse({"object": "list", "data": data})


async def _error_response(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, SimulatedAPIError):
        raise exc
    _simulator(request).stats.responses_by_status[exc.status_code] += 1
    return exc.response()


def create_hunyuan_simulator(config: SimulatorConfig | None = None) -> FastAPI:
    """The simulator app; `app.state.config` is the live `SimulatorConfig`, `app.state.stats` the `SimulatorStats`."""
    simulator = _Simulator(config if config is not None else SimulatorConfig())
    app = FastAPI(title="Hunyuan simulator", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.simulator = simulator
    app.state.config = simulator.config
    app.state.stats = simulator.stats
    app.include_router(router)
    app.add_exception_handler(SimulatedAPIError, _error_response)
    return app


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m simulators.hunyuan", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=9100)
    add("--api-key", default=None, help="the only accepted key (default: accept any)")
    add("--ttft", type=float, default=0.3, help="seconds before the first token (default 0.3)")
    add("--tps", type=float, default=40.0, help="content pieces per second; 0 = unpaced (default 40)")
    add("--qps", type=int, default=20, help="requests per rolling second before 429; 0 = no quota (default 20)")
    add("--max-concurrency", type=int, default=None, help="requests answered at once before 429")
    add("--error-rate", type=float, default=0.0, help="probability of a 500 (default 0)")
    add("--rate-limit-rate", type=float, default=0.0, help="probability of a random 429 (default 0)")
    add("--seed", type=int, default=0, help="seed of the random failures")
    add("--drop-after", type=int, default=None, help="cut every stream after N chunks, without [DONE]")
    add("--split-utf8", action="store_true", help="split multi-byte characters across two writes")
    add("--finish-reason", default=None, help='override the finish reason, e.g. "length"')
    add("--log-level", default="info")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    config = SimulatorConfig(
        api_key=args.api_key,
        ttft_seconds=args.ttft,
        tokens_per_second=args.tps or None,
        qps_quota=args.qps or None,
        max_concurrency=args.max_concurrency,
        error_rate=args.error_rate,
        rate_limit_rate=args.rate_limit_rate,
        seed=args.seed,
        drop_stream_after_chunks=args.drop_after,
        split_utf8=args.split_utf8,
        finish_reason=args.finish_reason,
    )
    uvicorn.run(create_hunyuan_simulator(config), host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
