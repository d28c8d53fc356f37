"""The simulated Hunyuan's HTTP routes: `POST /v1/chat/completions` and `GET /v1/models`, and the app."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from simulators.hunyuan.admission import Admission
from simulators.hunyuan.config import SimulatorConfig
from simulators.hunyuan.errors import SimulatedAPIError
from simulators.hunyuan.pacing import SimulatedStream, complete, events
from simulators.hunyuan.replies import answer, usage_requested
from simulators.serve import simulator_app

router = APIRouter()


def _simulator(request: Request) -> Admission:
    simulator: Admission = request.app.state.simulator
    return simulator


async def _json_body(request: Request) -> dict[str, Any] | None:
    try:
        body = json.loads(await request.body())
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _validated(body: dict[str, Any] | None, models: Sequence[str]) -> dict[str, Any]:
    """The body if it is a chat completion request the real service would accept; else a 400."""
    if body is None:
        raise SimulatedAPIError(400, "request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise SimulatedAPIError(400, f"model must be a string, got {model!r}")
    if model not in models:
        # TokenHub refuses a model it does not serve (the retired hunyuan-* names among them) as an invalid
        # parameter: 400 invalid_request_error.
        raise SimulatedAPIError(
            400, f"invalid parameter 'model': model {model!r} does not exist or is not available", "model_not_found"
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise SimulatedAPIError(400, "messages must be a non-empty list of objects with a role")
    if not isinstance(body.get("stream", False), bool):
        raise SimulatedAPIError(400, f"stream must be a boolean, got {body['stream']!r}")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise SimulatedAPIError(400, f"max_tokens must be a positive integer, got {max_tokens!r}")
    thinking = body.get("thinking")
    if thinking is not None and (not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "disabled")):
        message = f"invalid parameter 'thinking': type must be enabled or disabled, got {thinking!r}"
        raise SimulatedAPIError(400, message)
    if not isinstance(body.get("stream_options", {}), dict):
        raise SimulatedAPIError(400, f"stream_options must be an object, got {body['stream_options']!r}")
    if not isinstance(body.get("reasoning_effort", ""), str):
        raise SimulatedAPIError(400, f"reasoning_effort must be a string, got {body['reasoning_effort']!r}")
    return body


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
    reply = answer(payload, config)
    user = payload["user"] if isinstance(payload.get("user"), str) else ""
    simulator.admit(now, user)
    simulator.stats.responses_by_status[200] += 1
    simulator.stats.usage_by_answer[reply.id] = reply.usage
    if payload.get("stream"):
        config.drop_stream_after_chunks = simulator.stream_drop()
        stream = events(reply, config, include_usage=usage_requested(payload))
        return SimulatedStream(stream, simulator.stats, user)
    return await complete(reply, config, simulator.stats, user)


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
    app = simulator_app("Hunyuan simulator", Admission(config if config is not None else SimulatorConfig()))
    app.include_router(router)
    app.add_exception_handler(SimulatedAPIError, _error_response)
    return app
