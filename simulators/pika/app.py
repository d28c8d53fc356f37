"""The simulated fal queue's HTTP routes (submit, status, result, cancel, the JWKS), the Platform API's request
history, and the app."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from simulators.pika.config import PikaSimulatorConfig
from simulators.pika.fal_queue import FalQueue
from simulators.pika.jobs import CANCELLED, COMPLETED, FAILED, IN_PROGRESS, IN_QUEUE, Job
from simulators.pika.platform import PATH as HISTORY_PATH
from simulators.pika.platform import InvalidQueryError, history_page
from simulators.pika.webhooks import JWKS_PATH, public_jwk
from simulators.serve import simulator_app


class _FalError(Exception):
    """An answer fal gives as `{"detail": ...}` with an error status."""

    def __init__(self, status_code: int, detail: Any) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail


async def _error_response(_: Request, exc: Exception) -> Response:
    if not isinstance(exc, _FalError):
        raise exc
    return JSONResponse({"detail": exc.detail}, exc.status_code)


def _authorized(request: Request) -> FalQueue:
    """The app's queue, if the request carries the key it accepts; else a 401."""
    simulator: FalQueue = request.app.state.simulator
    if not simulator.authorized(request):
        raise _FalError(401, "Authentication failed: missing or wrong key in Authorization: Key")
    return simulator


def _job(simulator: FalQueue, owner: str, app: str, request_id: str) -> Job:
    job = simulator.jobs.get(request_id)
    if job is None or job.app_id != f"{owner}/{app}":
        raise _FalError(404, f"Request {request_id} not found")
    return job


def _urls(base: str, job: Job) -> dict[str, str]:
    prefix = f"{base}/{job.app_id}/requests/{job.request_id}"
    return {"status_url": f"{prefix}/status", "response_url": prefix, "cancel_url": f"{prefix}/cancel"}


async def jwks(request: Request) -> JSONResponse:
    simulator: FalQueue = request.app.state.simulator
    return JSONResponse({"keys": [public_jwk(simulator.webhooks.signing_key.public_key())]})


async def status(request: Request, owner: str, app: str, request_id: str) -> JSONResponse:
    simulator = _authorized(request)
    stats = simulator.stats
    stats.status_polls += 1
    stats.polls_by_request.setdefault(request_id, []).append((time.monotonic(), request.headers.get("user-agent", "")))
    await asyncio.sleep(simulator.config.status_delay_seconds)
    if simulator.roll(simulator.config.status_failure_rate):
        stats.status_failures += 1
        return JSONResponse({"detail": "Service temporarily unavailable"}, 503)
    job = _job(simulator, owner, app, request_id)
    base = str(request.base_url).rstrip("/")
    if job.state == IN_QUEUE:
        body: dict[str, Any] = {"status": IN_QUEUE, "queue_position": simulator.queue_position(job)}
    elif job.state == IN_PROGRESS:
        body = {"status": IN_PROGRESS, "logs": []}
    else:
        body = {"status": COMPLETED, "logs": []}
        if job.state != COMPLETED:
            body["error"] = job.error
    return JSONResponse({**body, "response_url": _urls(base, job)["response_url"]})


async def response(request: Request, owner: str, app: str, request_id: str) -> JSONResponse:
    simulator = _authorized(request)
    simulator.stats.result_reads += 1
    job = _job(simulator, owner, app, request_id)
    if job.state == COMPLETED:
        return JSONResponse(job.result)
    if job.state == FAILED:
        return JSONResponse({"detail": job.error}, 500)
    if job.state == CANCELLED:
        return JSONResponse({"detail": job.error}, 400)
    return JSONResponse({"detail": "request is still in progress"}, 400)


async def cancel(request: Request, owner: str, app: str, request_id: str) -> JSONResponse:
    simulator = _authorized(request)
    simulator.stats.cancels += 1
    simulator.stats.cancelled_requests.append(request_id)
    job = _job(simulator, owner, app, request_id)
    if job.ended:
        return JSONResponse({"status": "ALREADY_COMPLETED"}, 400)
    simulator.cancel(job)
    return JSONResponse({"status": "CANCELLATION_REQUESTED"}, 202)


async def _submitted_body(request: Request) -> dict[str, Any]:
    """The JSON object of a submit, with a non-empty `prompt`; else a 422 as fal's validation answers it."""
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise _FalError(422, [{"loc": ["body"], "msg": "body must be a JSON object"}])
    if not isinstance(body.get("prompt"), str) or not body["prompt"]:
        raise _FalError(422, [{"loc": ["body", "prompt"], "msg": "field required", "type": "value_error.missing"}])
    return body


async def submit(request: Request, model_path: str) -> JSONResponse:
    simulator = _authorized(request)
    segments = [segment for segment in model_path.split("/") if segment]
    if len(segments) < 2:
        raise _FalError(404, f"unknown app {model_path!r}: expected owner/app[/path]")
    sent_at = time.time()
    body = await _submitted_body(request)
    await asyncio.sleep(simulator.config.submit_delay_seconds)
    webhook_url = request.query_params.get("fal_webhook")
    job = simulator.submit("/".join(segments[:2]), "/".join(segments), body, webhook_url, sent_at)
    simulator.stats.last_request = body
    simulator.stats.last_headers = dict(request.headers)
    base = str(request.base_url).rstrip("/")
    answer = {"request_id": job.request_id, **_urls(base, job), "queue_position": simulator.queue_position(job)}
    return JSONResponse(answer)


async def requests_by_endpoint(request: Request) -> JSONResponse:
    """fal's Platform API request history (`platform.history_page`), with the queue's key."""
    simulator = _authorized(request)
    simulator.stats.history_calls += 1
    query: dict[str, list[str]] = {}
    for name, value in request.query_params.multi_items():
        query.setdefault(name, []).append(value)
    try:
        return JSONResponse(history_page(list(simulator.jobs.values()), query))
    except InvalidQueryError as exc:
        raise _FalError(422, [{"loc": ["query", str(exc).split(":")[0]], "msg": str(exc)}]) from exc


def create_pika_simulator(config: PikaSimulatorConfig | None = None) -> FastAPI:
    """The simulator app; `app.state.config` is the live config, `app.state.stats` the stats,
    `app.state.signing_key` the Ed25519 private key whose public half the JWKS publishes."""
    simulator = FalQueue(config if config is not None else PikaSimulatorConfig())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with httpx.AsyncClient() as simulator.webhooks.client:
            yield
            await simulator.stop()

    app = simulator_app("Pika (fal) simulator", simulator, lifespan)
    app.state.signing_key = simulator.webhooks.signing_key
    app.add_api_route(JWKS_PATH, jwks, methods=["GET"])
    app.add_api_route(HISTORY_PATH, requests_by_endpoint, methods=["GET"])  # before the queue's request routes
    app.add_api_route("/{owner}/{app}/requests/{request_id}/status", status, methods=["GET"])
    app.add_api_route("/{owner}/{app}/requests/{request_id}/cancel", cancel, methods=["PUT"])
    app.add_api_route("/{owner}/{app}/requests/{request_id}", response, methods=["GET"])
    app.add_api_route("/{model_path:path}", submit, methods=["POST"])
    app.add_exception_handler(_FalError, _error_response)
    return app
