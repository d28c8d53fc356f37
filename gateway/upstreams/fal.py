"""The fal.ai queue protocol (the video upstream: any fal app, Pika 2.2 by default) over one pooled
`aiohttp.ClientSession`.

    submit  POST {base}/{model_path}?fal_webhook=<url>   -> request_id, status_url, response_url, cancel_url
    status  GET  status_url                               -> IN_QUEUE (queue_position) | IN_PROGRESS | COMPLETED
    result  GET  response_url                             -> the model's output
    cancel  PUT  cancel_url                               -> 202 CANCELLATION_REQUESTED | 400 ALREADY_COMPLETED

fal builds the three URLs from the app id (`fal-ai/pika/requests/{id}/status`), not from the full model
path, so they are always taken from the submit answer and never rebuilt here.
All protocol details live in this module; another provider goes in a module beside it.
`aiohttp.ClientError` never leaves this module, and the API key never appears in an error.
aiohttp rather than httpx, as for chat: every task makes two or more upstream calls (submit, result, the
polls of tasks whose webhook is late), and httpx's pool cost about three times aiohttp's CPU per call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
from aiohttp.abc import AbstractResolver
from pydantic import SecretStr

from gateway.errors import (
    GatewayError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
    without_secret,
)
from gateway.upstreams.http_errors import UpstreamErrors
from gateway.upstreams.pool import PooledSession

FalState = Literal["IN_QUEUE", "IN_PROGRESS", "COMPLETED"]
_STATES: frozenset[str] = frozenset({"IN_QUEUE", "IN_PROGRESS", "COMPLETED"})
KEY_ENV = "VIDEO_API_KEY"


class VideoUpstreamError(UpstreamError):
    """fal failed a video call in a way the gateway cannot fix: it refused the gateway's credentials, answered
    an unexpected error status, or an unreadable answer. Never answered to a client: a submit is tried again
    until the task's deadline, and a job whose result is an error ends its task `failed`.

    Do: client: read the task's `error.code`; operator: check `VIDEO_API_KEY`; the log quotes fal's answer.
    """


class VideoUnavailableError(UpstreamUnavailableError):
    """fal could not be reached, or answered 502, 503 or 504. Never answered to a client: the submit or poll is
    tried again with back-off until the task's deadline (then the task fails with `timeout`).

    Do: nothing for clients; operator: egress to `VIDEO_BASE_URL`,
    `gateway_video_upstream_submits_total{result="retry"}`.
    """


class VideoTimeoutError(UpstreamTimeoutError):
    """A call to fal, or to its request history, did not answer in time. Never answered to a client: after a
    submit the job may exist, so its task waits `VIDEO_UNKNOWN_SUBMIT_WAIT_SECONDS` for the job to show before
    submitting again; a poll is tried again.

    Do: nothing for clients; operator: fal's latency and egress to it.
    """


ERRORS = UpstreamErrors("video upstream", KEY_ENV, VideoUpstreamError, VideoUnavailableError)


class VideoNotConfiguredError(UpstreamUnavailableError):
    """A video route was called on a gateway started without `VIDEO_API_KEY`.

    Do: operator: set `VIDEO_API_KEY` (Helm: the gateway's Secret) and restart the gateway.
    """

    code = "not_configured"


@dataclass(frozen=True)
class FalSubmission:
    request_id: str
    status_url: str
    response_url: str
    cancel_url: str


@dataclass(frozen=True)
class FalStatus:
    state: FalState
    queue_position: int | None = None


@dataclass(frozen=True)
class FalReply:
    """A whole upstream answer, read before the connection goes back to the pool."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes


class FalQueueClient:
    """One fal.ai queue app; use as an async context manager or call `aclose`."""

    def __init__(
        self,
        base_url: str = "https://queue.fal.run",
        api_key: SecretStr | None = None,
        model_path: str = "fal-ai/pika/v2.2/text-to-video",
        *,
        connect_timeout_seconds: float = 5.0,
        read_timeout_seconds: float = 30.0,
        max_connections: int = 20,
        user_agent: str = "ai-gateway",
        resolver: AbstractResolver | None = None,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._model_path = model_path.strip("/")
        self._pool = PooledSession(
            max_connections=max_connections,
            connect_seconds=connect_timeout_seconds,
            read_seconds=read_timeout_seconds,
            resolver=resolver,
            headers={"User-Agent": user_agent},
        )

    @property
    def configured(self) -> bool:
        return self._api_key is not None

    async def __aenter__(self) -> FalQueueClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def submit(self, arguments: dict[str, Any], webhook_url: str | None = None) -> FalSubmission:
        """Queue one generation; fal calls `webhook_url` (if given) when it finishes."""
        params = {"fal_webhook": webhook_url} if webhook_url else None
        reply = await self._send("POST", f"{self._base_url}/{self._model_path}", json_body=arguments, params=params)
        payload = json_object(reply, "submit")
        fields = ("request_id", "status_url", "response_url", "cancel_url")
        missing = [name for name in fields if not isinstance(payload.get(name), str) or not payload.get(name)]
        if missing:
            raise VideoUpstreamError(f"video upstream submit answer lacks {', '.join(missing)}")
        return FalSubmission(*(str(payload[name]) for name in fields))

    async def status(self, submission_or_status_url: FalSubmission | str) -> FalStatus:
        url = (
            submission_or_status_url.status_url
            if isinstance(submission_or_status_url, FalSubmission)
            else submission_or_status_url
        )
        payload = json_object(await self._send("GET", url), "status")
        state = payload.get("status")
        if state not in _STATES:
            raise VideoUpstreamError(f"video upstream status {state!r} is not one of {', '.join(sorted(_STATES))}")
        position = payload.get("queue_position")
        queue_position = position if isinstance(position, int) and not isinstance(position, bool) else None
        return FalStatus(state=state, queue_position=queue_position)

    async def result(self, response_url: str) -> dict[str, Any]:
        return json_object(await self._send("GET", response_url), "result")

    def submission_of(self, request_id: str) -> FalSubmission:
        """The URLs of job `request_id` known only by its id (from its webhook, when the submit answer was lost):
        fal's queue addresses a request under the app (owner/name), not the endpoint path, as its answers do."""
        app_id = "/".join(self._model_path.split("/")[:2])
        base = f"{self._base_url}/{app_id}/requests/{quote(request_id, safe='')}"
        return FalSubmission(request_id, f"{base}/status", base, f"{base}/cancel")

    async def cancel(self, cancel_url: str) -> bool:
        """True when fal accepted the cancellation, False when the request had already completed."""
        reply = await self._send("PUT", cancel_url, accept={400})
        if reply.status == 400:
            payload = json_object(reply, "cancel")
            if payload.get("status") == "ALREADY_COMPLETED":
                return False
            raise _error_of(reply, self._api_key)
        return True

    async def _send(
        self,
        method: str,
        url: str,
        *,
        json_body: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        accept: frozenset[int] | set[int] = frozenset(),
    ) -> FalReply:
        return await fal_call(self._pool, self._api_key, method, url, json_body=json_body, params=params, accept=accept)


async def fal_call(
    pool: PooledSession,
    api_key: SecretStr | None,
    method: str,
    url: str,
    *,
    json_body: dict[str, Any] | None = None,
    params: dict[str, str] | None = None,
    accept: frozenset[int] | set[int] = frozenset(),
) -> FalReply:
    """One authenticated call to a fal API (the queue, the Platform API), read whole; errors in our classes."""
    if api_key is None:
        raise VideoNotConfiguredError(f"video generation is not configured: set {KEY_ENV}")
    headers = {"Authorization": f"Key {api_key.get_secret_value()}"}
    try:
        async with pool.get().request(method, url, json=json_body, params=params, headers=headers) as answer:
            reply = FalReply(answer.status, answer.reason or "", answer.headers, await answer.read())
    except TimeoutError as exc:  # aiohttp's connect and read timeouts are TimeoutErrors too
        raise VideoTimeoutError("video upstream did not answer in time") from exc
    except aiohttp.ClientError as exc:
        raise VideoUnavailableError(f"video upstream unreachable: {type(exc).__name__}") from exc
    if reply.status < 400 or reply.status in accept:
        return reply
    raise _error_of(reply, api_key)


def json_object(reply: FalReply, what: str) -> dict[str, Any]:
    try:
        payload = json.loads(reply.body)
    except ValueError as exc:
        raise VideoUpstreamError(f"video upstream answered an unreadable {what}: {type(exc).__name__}") from exc
    if not isinstance(payload, dict):
        raise VideoUpstreamError(f"video upstream {what} answer is a {type(payload).__name__}, expected an object")
    return payload


def _error_of(reply: FalReply, api_key: SecretStr | None) -> GatewayError:
    """fal's error in our classes; its message passes through (an echoed key redacted), our credentials never do."""
    try:
        payload = json.loads(reply.body)
        detail = payload.get("detail", payload) if isinstance(payload, dict) else payload
        message = str(detail)
    except ValueError:
        message = reply.reason
    message = without_secret(message, api_key)
    return ERRORS.of_status(reply.status, message, reply.headers.get("retry-after"))


# fal's text-to-video apps (Pika 2.2 among them) take an aspect ratio and a resolution rather than pixel sizes.
ASPECT_RATIOS = {
    "16:9": 16 / 9,
    "9:16": 9 / 16,
    "1:1": 1.0,
    "4:5": 4 / 5,
    "5:4": 5 / 4,
    "3:2": 3 / 2,
    "2:3": 2 / 3,
}


def text_to_video_arguments(
    prompt: str, *, negative_prompt: str | None, width: int | None, height: int | None, options: dict[str, Any]
) -> dict[str, Any]:
    """The fal request body for a generation: the nearest aspect ratio and resolution for a pixel size;
    the client's own options (e.g. `aspect_ratio`, `seed`, `duration`) win over what is derived."""
    arguments: dict[str, Any] = {"prompt": prompt}
    if negative_prompt:
        arguments["negative_prompt"] = negative_prompt
    if width is not None and height is not None:
        ratio = width / height
        arguments["aspect_ratio"] = min(ASPECT_RATIOS, key=lambda name: abs(ASPECT_RATIOS[name] - ratio))
        arguments["resolution"] = "1080p" if min(width, height) >= 1080 else "720p"
    return {**arguments, **options}


def result_urls(payload: dict[str, Any]) -> list[str]:
    """File URLs in a fal result: `video`/`image` objects and `videos`/`images` lists, in that order."""
    files: list[Any] = []
    for single, many in (("video", "videos"), ("image", "images")):
        files.append(payload.get(single))
        listed = payload.get(many)
        if isinstance(listed, list):
            files.extend(listed)
    return [file["url"] for file in files if isinstance(file, dict) and isinstance(file.get("url"), str)]
