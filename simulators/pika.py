"""A simulator of Pika's video API as fal.ai serves it (the fal queue protocol), for the tests and the demo.

It speaks the real protocol:

- `POST /{model_path}?fal_webhook=<url>` (any path, e.g. `fal-ai/pika/v2.2/text-to-video`; header
  `Authorization: Key <key>`; a JSON body with `prompt` etc.) queues a job and answers
  `{"request_id", "status_url", "response_url", "cancel_url", "queue_position"}`. The URLs use the app id,
  the first two segments of the path: `/{owner}/{app}/requests/{request_id}[/status|/cancel]`.
- `GET .../requests/{id}/status` answers `{"status": "IN_QUEUE", "queue_position": n}`, `{"status":
  "IN_PROGRESS"}` or `{"status": "COMPLETED"}` (a job is IN_QUEUE for `queue_fraction` of `job_seconds`).
- `GET .../requests/{id}` answers the result `{"video": {"url": ...}}` once the job succeeded, 400
  `{"detail": "request is still in progress"}` before, or for a failed job 500 `{"detail": <error>}`
  (a cancelled one: 400 `{"detail": "request was cancelled"}`).
- `PUT .../requests/{id}/cancel` answers 202 `{"status": "CANCELLATION_REQUESTED"}` if not completed
  (the job then ends in ERROR), else 400 `{"status": "ALREADY_COMPLETED"}`.
- Unknown request ids answer 404, a wrong key 401 `{"detail": ...}`.
- When a job ends it POSTs the webhook to `fal_webhook`: JSON `{"request_id", "gateway_request_id",
  "status": "OK"|"ERROR", "payload": result|null, "error": str|null}` with the headers
  `X-Fal-Webhook-Request-Id`, `-User-Id`, `-Timestamp` (unix seconds) and `-Signature`: the hex Ed25519
  signature of `"\\n".join([request_id, user_id, timestamp, sha256_hex(raw_body)])` (see `webhook_message`).
- `GET /.well-known/jwks.json` publishes the simulator's Ed25519 public key (`kid` "sim-1").

On request it misbehaves: slow submits, slow or failing (503) status calls, failed jobs (`failure_rate`,
`fail_next`), lost webhooks, duplicated webhooks, a stale copy sent after the final webhook (`out_of_order`),
late webhooks, forged signatures and stale timestamps. Webhooks are retried (`callback_attempts`) when the
receiver fails or answers non-2xx.

`PikaSimulatorConfig` may be changed while the server runs (a job reads it when it is submitted);
`PikaSimulatorStats` (`app.state.stats`) records what happened.

Standalone: `python -m simulators.pika --host 127.0.0.1 --port 9200 --job-seconds 5`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import copy
import hashlib
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

DEFAULT_MODEL_PATH = "fal-ai/pika/v2.2/text-to-video"
JWKS_PATH = "/.well-known/jwks.json"
KEY_ID = "sim-1"

# Job states, as counted in `PikaSimulatorStats.jobs_by_state`.
IN_QUEUE = "IN_QUEUE"
IN_PROGRESS = "IN_PROGRESS"
COMPLETED = "COMPLETED"  # succeeded
FAILED = "FAILED"  # ended in ERROR (simulated failure)
CANCELLED = "CANCELLED"  # ended in ERROR after a cancel


@dataclass
class PikaSimulatorConfig:
    """How the simulated Pika-on-fal behaves. Mutable at run time: a job reads it when it is submitted."""

    api_key: str | None = None  # the only accepted `Authorization: Key` key; None accepts any or none
    job_seconds: float = 0.3  # submission to end of job
    submit_delay_seconds: float = 0.0  # how long the submit call takes to answer (a slow upstream)
    status_delay_seconds: float = 0.0  # how long a status call takes to answer
    status_failure_rate: float = 0.0  # probability a status call answers 503
    queue_fraction: float = 0.3  # the first part of job_seconds spent IN_QUEUE, the rest IN_PROGRESS
    failure_rate: float = 0.0  # probability a job ends in ERROR
    fail_next: int = 0  # the next N jobs end in ERROR (decremented per job)
    error_message: str = "Simulated Pika generation failure"
    callback_loss_rate: float = 0.0  # probability a job's webhook is never sent
    duplicate_callbacks: bool = False  # send each webhook twice
    out_of_order: bool = False  # after the final webhook, send a stale copy (older timestamp, signed)
    out_of_order_age_seconds: int = 30  # how much older the stale copy's timestamp is
    callback_delay_seconds: float = 0.0  # between the end of a job and its webhook
    callback_attempts: int = 3  # tries per webhook delivery (exception, timeout or non-2xx: try again)
    callback_retry_seconds: float = 0.1  # pause between tries
    callback_timeout_seconds: float = 5.0
    payload_errors: bool = False  # OK webhooks carry "payload": null and a payload_error (fal could not attach it)
    sign_with_wrong_key: bool = False  # sign webhooks with a key not in the JWKS (forged)
    stale_timestamp_seconds: int = 0  # shift the webhook timestamp (negative: into the past)
    user_id: str = "sim-user"
    seed: int = 0  # seeds the random failures and losses (changing it reseeds)
    video_base_url: str = "https://v3.fal.media/files/pika-sim"


@dataclass
class PikaSimulatorStats:
    """What the simulator saw and did. Written by the server's event loop; read it from tests as a snapshot."""

    submitted: int = 0
    submitted_by_model: Counter[str] = field(default_factory=Counter)
    status_polls: int = 0
    status_failures: int = 0  # status calls answered 503 on purpose
    polls_by_request: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # (monotonic, User-Agent)
    result_reads: int = 0
    cancels: int = 0  # cancel requests, accepted or not
    unauthorized: int = 0  # 401 answers
    callbacks_sent: int = 0  # deliveries the receiver accepted (2xx), duplicates and stale copies included
    callbacks_failed: int = 0  # deliveries that failed every attempt
    callbacks_lost: int = 0  # webhooks dropped on purpose (callback_loss_rate)
    callback_attempts: int = 0  # HTTP tries, retries included
    jobs_by_state: Counter[str] = field(default_factory=Counter)  # current state of every job
    last_request: dict[str, Any] | None = None  # the last submitted JSON body
    last_headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Job:
    request_id: str
    app_id: str
    model_path: str
    body: dict[str, Any]
    webhook_url: str | None
    config: PikaSimulatorConfig  # a copy, as it was at submission
    submitted_at: float  # monotonic
    will_fail: bool
    lose_callback: bool
    state: str = IN_QUEUE
    result: dict[str, Any] | None = None
    error: str | None = None
    cancel_requested: bool = False

    @property
    def ended(self) -> bool:
        return self.state in (COMPLETED, FAILED, CANCELLED)


def webhook_message(request_id: str, user_id: str, timestamp: str, body: bytes) -> bytes:
    """The bytes fal signs for a webhook: request id, user id, timestamp and sha256 hex of the raw body."""
    return "\n".join([request_id, user_id, timestamp, hashlib.sha256(body).hexdigest()]).encode()


def public_jwk(public_key: Ed25519PublicKey, kid: str = KEY_ID) -> dict[str, str]:
    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid}


class _Simulator:
    def __init__(self, config: PikaSimulatorConfig) -> None:
        self.config = config
        self.stats = PikaSimulatorStats()
        self.jobs: dict[str, _Job] = {}
        self.signing_key = Ed25519PrivateKey.generate()
        self.forged_key = Ed25519PrivateKey.generate()
        self.tasks: set[asyncio.Task[None]] = set()
        self.webhooks: httpx.AsyncClient | None = None  # one pooled client for every webhook, opened at start
        self._seed = config.seed
        self._random = random.Random(config.seed)

    def roll(self, probability: float) -> bool:
        if self.config.seed != self._seed:
            self._seed, self._random = self.config.seed, random.Random(self.config.seed)
        return self._random.random() < probability

    def authorized(self, request: Request) -> bool:
        expected = self.config.api_key
        if expected is None or request.headers.get("authorization") == f"Key {expected}":
            return True
        self.stats.unauthorized += 1
        return False

    def set_state(self, job: _Job, state: str) -> None:
        self.stats.jobs_by_state[job.state] -= 1
        self.stats.jobs_by_state[state] += 1
        job.state = state

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # -- job life -------------------------------------------------------------------------------------

    async def run_job(self, job: _Job) -> None:
        config = job.config
        queue_seconds = config.job_seconds * config.queue_fraction
        await asyncio.sleep(queue_seconds)
        if not job.ended:
            self.set_state(job, IN_PROGRESS)
        await asyncio.sleep(config.job_seconds - queue_seconds)
        if not job.ended:
            if job.will_fail:
                job.error = config.error_message
                self.set_state(job, FAILED)
            else:
                job.result = self.result(job)
                self.set_state(job, COMPLETED)
        await self.deliver(job)

    def end_cancelled(self, job: _Job) -> None:
        job.cancel_requested = True
        job.error = "request was cancelled"
        self.set_state(job, CANCELLED)

    def result(self, job: _Job) -> dict[str, Any]:
        seed = job.body.get("seed")
        return {
            "video": {
                "url": f"{job.config.video_base_url}/{job.request_id}/video.mp4",
                "content_type": "video/mp4",
                "file_name": "video.mp4",
                "file_size": 1_048_576,
            },
            "seed": seed if isinstance(seed, int) else 42,
        }

    def queue_position(self, job: _Job) -> int:
        return sum(
            1 for other in self.jobs.values() if other.state == IN_QUEUE and other.submitted_at < job.submitted_at
        )

    # -- webhooks -------------------------------------------------------------------------------------

    def webhook_body(self, job: _Job) -> bytes:
        ok = job.state == COMPLETED
        body = {
            "request_id": job.request_id,
            "gateway_request_id": job.request_id,
            "status": "OK" if ok else "ERROR",
            "payload": job.result if ok else None,
            "error": None if ok else job.error,
        }
        if ok and job.config.payload_errors:  # the output stays readable at the response URL
            body["payload"] = None
            body["payload_error"] = "Response payload is not JSON serializable"
        return json.dumps(body, separators=(",", ":")).encode()

    def signed_headers(self, job: _Job, body: bytes, timestamp: int) -> dict[str, str]:
        config = job.config
        key = self.forged_key if config.sign_with_wrong_key else self.signing_key
        stamp = str(timestamp)
        signature = key.sign(webhook_message(job.request_id, config.user_id, stamp, body)).hex()
        return {
            "Content-Type": "application/json",
            "X-Fal-Webhook-Request-Id": job.request_id,
            "X-Fal-Webhook-User-Id": config.user_id,
            "X-Fal-Webhook-Timestamp": stamp,
            "X-Fal-Webhook-Signature": signature,
        }

    async def deliver(self, job: _Job) -> None:
        config = job.config
        if job.webhook_url is None:
            return
        if job.lose_callback:
            self.stats.callbacks_lost += 1
            return
        await asyncio.sleep(config.callback_delay_seconds)
        body = self.webhook_body(job)
        now = int(time.time()) + config.stale_timestamp_seconds
        copies = 2 if config.duplicate_callbacks else 1
        for _ in range(copies):
            await self.post(job, body, self.signed_headers(job, body, now))
        if config.out_of_order:
            old = now - config.out_of_order_age_seconds
            await self.post(job, body, self.signed_headers(job, body, old))

    async def post(self, job: _Job, body: bytes, headers: dict[str, str]) -> None:
        assert job.webhook_url is not None
        assert self.webhooks is not None, "webhooks are sent only while the app runs (its lifespan opens the client)"
        for attempt in range(max(job.config.callback_attempts, 1)):
            if attempt:
                await asyncio.sleep(job.config.callback_retry_seconds)
            self.stats.callback_attempts += 1
            try:
                response = await self.webhooks.post(
                    job.webhook_url, content=body, headers=headers, timeout=job.config.callback_timeout_seconds
                )
            except httpx.HTTPError:
                continue
            if response.is_success:
                self.stats.callbacks_sent += 1
                return
        self.stats.callbacks_failed += 1


def _simulator(request: Request) -> _Simulator:
    simulator: _Simulator = request.app.state.simulator
    return simulator


def _unauthorized() -> JSONResponse:
    return JSONResponse({"detail": "Authentication failed: missing or wrong key in Authorization: Key"}, 401)


def _not_found(request_id: str) -> JSONResponse:
    return JSONResponse({"detail": f"Request {request_id} not found"}, 404)


def _job(simulator: _Simulator, owner: str, app: str, request_id: str) -> _Job | None:
    job = simulator.jobs.get(request_id)
    return job if job is not None and job.app_id == f"{owner}/{app}" else None


def _urls(base: str, job: _Job) -> dict[str, str]:
    prefix = f"{base}/{job.app_id}/requests/{job.request_id}"
    return {"status_url": f"{prefix}/status", "response_url": prefix, "cancel_url": f"{prefix}/cancel"}


async def jwks(request: Request) -> JSONResponse:
    return JSONResponse({"keys": [public_jwk(_simulator(request).signing_key.public_key())]})


async def status(request: Request, owner: str, app: str, request_id: str) -> JSONResponse:
    simulator = _simulator(request)
    if not simulator.authorized(request):
        return _unauthorized()
    stats = simulator.stats
    stats.status_polls += 1
    stats.polls_by_request.setdefault(request_id, []).append((time.monotonic(), request.headers.get("user-agent", "")))
    await asyncio.sleep(simulator.config.status_delay_seconds)
    if simulator.roll(simulator.config.status_failure_rate):
        stats.status_failures += 1
        return JSONResponse({"detail": "Service temporarily unavailable"}, 503)
    job = _job(simulator, owner, app, request_id)
    if job is None:
        return _not_found(request_id)
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
    simulator = _simulator(request)
    if not simulator.authorized(request):
        return _unauthorized()
    simulator.stats.result_reads += 1
    job = _job(simulator, owner, app, request_id)
    if job is None:
        return _not_found(request_id)
    if job.state == COMPLETED:
        return JSONResponse(job.result)
    if job.state == FAILED:
        return JSONResponse({"detail": job.error}, 500)
    if job.state == CANCELLED:
        return JSONResponse({"detail": job.error}, 400)
    return JSONResponse({"detail": "request is still in progress"}, 400)


async def cancel(request: Request, owner: str, app: str, request_id: str) -> JSONResponse:
    simulator = _simulator(request)
    if not simulator.authorized(request):
        return _unauthorized()
    simulator.stats.cancels += 1
    job = _job(simulator, owner, app, request_id)
    if job is None:
        return _not_found(request_id)
    if job.ended:
        return JSONResponse({"status": "ALREADY_COMPLETED"}, 400)
    simulator.end_cancelled(job)
    return JSONResponse({"status": "CANCELLATION_REQUESTED"}, 202)


async def submit(request: Request, model_path: str) -> JSONResponse:
    simulator = _simulator(request)
    if not simulator.authorized(request):
        return _unauthorized()
    segments = [segment for segment in model_path.split("/") if segment]
    if len(segments) < 2:
        return JSONResponse({"detail": f"unknown app {model_path!r}: expected owner/app[/path]"}, 404)
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return JSONResponse({"detail": [{"loc": ["body"], "msg": "body must be a JSON object"}]}, 422)
    if not isinstance(body.get("prompt"), str) or not body["prompt"]:
        detail = [{"loc": ["body", "prompt"], "msg": "field required", "type": "value_error.missing"}]
        return JSONResponse({"detail": detail}, 422)
    await asyncio.sleep(simulator.config.submit_delay_seconds)
    config = copy.copy(simulator.config)
    will_fail = config.fail_next > 0 or simulator.roll(config.failure_rate)
    if simulator.config.fail_next > 0:
        simulator.config.fail_next -= 1
    job = _Job(
        request_id=str(uuid.uuid4()),
        app_id="/".join(segments[:2]),
        model_path="/".join(segments),
        body=body,
        webhook_url=request.query_params.get("fal_webhook"),
        config=config,
        submitted_at=time.monotonic(),
        will_fail=will_fail,
        lose_callback=simulator.roll(config.callback_loss_rate),
    )
    simulator.jobs[job.request_id] = job
    stats = simulator.stats
    stats.submitted += 1
    stats.submitted_by_model[job.model_path] += 1
    stats.jobs_by_state[IN_QUEUE] += 1
    stats.last_request = body
    stats.last_headers = dict(request.headers)
    simulator.spawn(simulator.run_job(job))
    base = str(request.base_url).rstrip("/")
    answer = {"request_id": job.request_id, **_urls(base, job), "queue_position": simulator.queue_position(job)}
    return JSONResponse(answer)


def create_pika_simulator(config: PikaSimulatorConfig | None = None) -> FastAPI:
    """The simulator app; `app.state.config` is the live config, `app.state.stats` the stats,
    `app.state.signing_key` the Ed25519 private key whose public half the JWKS publishes."""
    simulator = _Simulator(config if config is not None else PikaSimulatorConfig())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with httpx.AsyncClient() as simulator.webhooks:
            yield
            tasks = list(simulator.tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    app = FastAPI(title="Pika (fal) simulator", openapi_url=None, docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.simulator = simulator
    app.state.config = simulator.config
    app.state.stats = simulator.stats
    app.state.signing_key = simulator.signing_key
    app.add_api_route(JWKS_PATH, jwks, methods=["GET"])
    app.add_api_route("/{owner}/{app}/requests/{request_id}/status", status, methods=["GET"])
    app.add_api_route("/{owner}/{app}/requests/{request_id}/cancel", cancel, methods=["PUT"])
    app.add_api_route("/{owner}/{app}/requests/{request_id}", response, methods=["GET"])
    app.add_api_route("/{model_path:path}", submit, methods=["POST"])
    return app


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m simulators.pika", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=9200)
    add("--api-key", default=None, help="the only accepted key (default: accept any)")
    add("--job-seconds", type=float, default=5.0, help="seconds a job takes (default 5)")
    add("--failure-rate", type=float, default=0.0)
    add("--callback-loss-rate", type=float, default=0.0)
    add("--callback-delay", type=float, default=0.0)
    add("--duplicate-callbacks", action="store_true")
    add("--out-of-order", action="store_true")
    add("--seed", type=int, default=0)
    add("--log-level", default="info")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    config = PikaSimulatorConfig(
        api_key=args.api_key,
        job_seconds=args.job_seconds,
        failure_rate=args.failure_rate,
        callback_loss_rate=args.callback_loss_rate,
        callback_delay_seconds=args.callback_delay,
        duplicate_callbacks=args.duplicate_callbacks,
        out_of_order=args.out_of_order,
        seed=args.seed,
    )
    uvicorn.run(create_pika_simulator(config), host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
