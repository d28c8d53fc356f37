"""FalQueueClient against a fake fal.ai queue: a local HTTP server that answers with each test's handler.

The handlers take and return httpx's Request/Response types (plain data here, nothing is sent by httpx);
the client reaches the server over real HTTP through a resolver that sends every host to it.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import httpx
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from pydantic import SecretStr

from gateway.errors import InvalidRequestError, OverloadedError, UpstreamUnavailableError
from gateway.upstreams.fal import (
    FalQueueClient,
    FalStatus,
    FalSubmission,
    VideoNotConfiguredError,
    VideoTimeoutError,
    VideoUnavailableError,
    VideoUpstreamError,
)

KEY = "fal-secret-key-1234"
BASE = "http://queue.fal.run"
APP = f"{BASE}/fal-ai/pika/requests/req-1"
SUBMITTED = {
    "request_id": "req-1",
    "status_url": f"{APP}/status",
    "response_url": APP,
    "cancel_url": f"{APP}/cancel",
}

Handler = Callable[[httpx.Request], httpx.Response]


class _ToPort(AbstractResolver):
    """Every host name resolves to 127.0.0.1:`port`."""

    def __init__(self, port: int) -> None:
        self.port = port

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            {"hostname": host, "host": "127.0.0.1", "port": self.port, "family": socket.AF_INET, "proto": 0, "flags": 0}
        ]

    async def close(self) -> None:
        pass


async def _fake_fal(handler: Handler, delay: float) -> tuple[web.AppRunner, int]:
    async def answer(request: web.Request) -> web.Response:
        await asyncio.sleep(delay)
        sent = httpx.Request(
            request.method,
            f"http://{request.host}{request.raw_path}",
            headers=dict(request.headers),
            content=await request.read(),
        )
        reply = handler(sent)
        headers = {k: v for k, v in reply.headers.items() if k.lower() not in ("content-length", "content-encoding")}
        return web.Response(status=reply.status_code, body=reply.content, headers=headers)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.SockSite(runner, socket.create_server(("127.0.0.1", 0)))
    await site.start()
    return runner, int(runner.addresses[0][1])


async def _call(
    handler: Handler,
    call: Callable[[FalQueueClient], Any],
    api_key: str | None = KEY,
    *,
    delay: float = 0.0,
    read_timeout: float = 5.0,
    port: int | None = None,
) -> Any:
    """`call` on a client whose every host is the fake queue (or `port`, when given)."""
    runner, served = await _fake_fal(handler, delay)
    try:
        async with FalQueueClient(
            BASE,
            SecretStr(api_key) if api_key is not None else None,
            read_timeout_seconds=read_timeout,
            resolver=_ToPort(port or served),
        ) as client:
            return await call(client)
    finally:
        await runner.cleanup()


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as server:
        return int(server.getsockname()[1])


async def test_submit_posts_arguments_with_key_and_url_encoded_webhook() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={**SUBMITTED, "queue_position": 3})

    hook = "https://gw.example/v1/webhooks/fal?job=a b&x=1"
    submission = await _call(handler, lambda c: c.submit({"prompt": "a cat"}, hook))

    assert submission == FalSubmission("req-1", f"{APP}/status", APP, f"{APP}/cancel")
    (request,) = seen
    assert request.method == "POST"
    assert request.url.path == "/fal-ai/pika/v2.2/text-to-video"
    assert request.url.host == "queue.fal.run"
    assert request.headers["authorization"] == f"Key {KEY}"
    assert json.loads(request.content) == {"prompt": "a cat"}
    assert parse_qs(urlsplit(str(request.url)).query) == {"fal_webhook": [hook]}
    assert "a%20b" in str(request.url) or "a+b" in str(request.url)


async def test_submit_without_webhook_sends_no_query() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=SUBMITTED)

    await _call(handler, lambda c: c.submit({"prompt": "x"}, None))
    assert seen[0].url.query == b""


async def test_submit_answer_missing_urls_is_an_upstream_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"request_id": "req-1"})

    with pytest.raises(VideoUpstreamError, match="status_url, response_url, cancel_url"):
        await _call(handler, lambda c: c.submit({}, None))


async def test_status_result_cancel_use_the_urls_fal_gave() -> None:
    seen: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, str(request.url)))
        assert request.headers["authorization"] == f"Key {KEY}"
        if request.method == "POST":
            return httpx.Response(200, json=SUBMITTED)
        if request.url.path.endswith("/status"):
            return httpx.Response(200, json={"status": "IN_QUEUE", "queue_position": 2})
        if request.url.path.endswith("/cancel"):
            return httpx.Response(202, json={"status": "CANCELLATION_REQUESTED"})
        return httpx.Response(200, json={"video": {"url": "https://v.fal.media/out.mp4"}})

    async def flow(client: FalQueueClient) -> tuple[FalStatus, FalStatus, dict[str, Any], bool]:
        submission = await client.submit({"prompt": "x"}, None)
        by_submission = await client.status(submission)
        by_url = await client.status(submission.status_url)
        result = await client.result(submission.response_url)
        cancelled = await client.cancel(submission.cancel_url)
        return by_submission, by_url, result, cancelled

    by_submission, by_url, result, cancelled = await _call(handler, flow)
    assert by_submission == by_url == FalStatus("IN_QUEUE", 2)
    assert result == {"video": {"url": "https://v.fal.media/out.mp4"}}
    assert cancelled is True
    assert seen == [
        ("POST", f"{BASE}/fal-ai/pika/v2.2/text-to-video"),
        ("GET", f"{APP}/status"),
        ("GET", f"{APP}/status"),
        ("GET", APP),
        ("PUT", f"{APP}/cancel"),
    ]
    # Never rebuilt from the full model path.
    assert not any("v2.2/text-to-video/requests" in url for _, url in seen)


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"status": "IN_PROGRESS", "logs": []}, FalStatus("IN_PROGRESS", None)),
        ({"status": "COMPLETED", "response_url": APP}, FalStatus("COMPLETED", None)),
        ({"status": "IN_QUEUE", "queue_position": 0}, FalStatus("IN_QUEUE", 0)),
    ],
)
async def test_status_states(payload: dict[str, Any], expected: FalStatus) -> None:
    assert await _call(lambda r: httpx.Response(200, json=payload), lambda c: c.status(f"{APP}/status")) == expected


async def test_unknown_status_is_an_upstream_error() -> None:
    with pytest.raises(VideoUpstreamError, match="'EXPLODED'"):
        await _call(lambda r: httpx.Response(200, json={"status": "EXPLODED"}), lambda c: c.status(f"{APP}/status"))


async def test_cancel_of_completed_request_is_false() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"status": "ALREADY_COMPLETED"})

    assert await _call(handler, lambda c: c.cancel(f"{APP}/cancel")) is False


async def test_cancel_other_400_is_an_invalid_request() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"detail": "bad id"})

    with pytest.raises(InvalidRequestError, match="bad id"):
        await _call(handler, lambda c: c.cancel(f"{APP}/cancel"))


@pytest.mark.parametrize("status", [401, 403])
async def test_rejected_credentials_name_the_variable_never_the_key(status: int) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"detail": f"invalid key {KEY}"})

    with pytest.raises(VideoUpstreamError) as caught:
        await _call(handler, lambda c: c.submit({}, None))
    assert "VIDEO_API_KEY" in caught.value.message
    assert KEY not in str(caught.value)
    assert caught.value.status_code == 502


async def test_echoed_key_is_redacted_from_upstream_messages() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"detail": f"crash while using {KEY}"})

    with pytest.raises(VideoUpstreamError) as caught:
        await _call(handler, lambda c: c.result(APP))
    assert KEY not in str(caught.value)
    assert "***" in str(caught.value)


async def test_429_is_overloaded_with_retry_after() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": "7"}, json={"detail": "slow down"})

    with pytest.raises(OverloadedError) as caught:
        await _call(handler, lambda c: c.submit({}, None))
    assert caught.value.headers == {"Retry-After": "7"}
    assert caught.value.status_code == 429


async def test_missing_key_is_503_naming_the_variable_and_sends_nothing() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("no request may be sent without a key")

    with pytest.raises(VideoNotConfiguredError) as caught:
        await _call(handler, lambda c: c.submit({}, None), api_key=None)
    assert isinstance(caught.value, UpstreamUnavailableError)
    assert caught.value.status_code == 503
    assert "VIDEO_API_KEY" in caught.value.message


async def test_connection_error_is_unavailable() -> None:
    with pytest.raises(VideoUnavailableError) as caught:
        await _call(lambda r: httpx.Response(200, json=SUBMITTED), lambda c: c.submit({}, None), port=_closed_port())
    assert caught.value.status_code == 503
    assert isinstance(caught.value.__cause__, aiohttp.ClientConnectionError)
    assert KEY not in caught.value.message


async def test_timeout_is_a_timeout_error() -> None:
    with pytest.raises(VideoTimeoutError) as caught:
        answer = httpx.Response(200, json={"status": "IN_PROGRESS"})
        await _call(lambda r: answer, lambda c: c.status(f"{APP}/status"), delay=1.0, read_timeout=0.2)
    assert caught.value.status_code == 504


@pytest.mark.parametrize("status", [502, 503, 504])
async def test_gateway_statuses_are_unavailable(status: int) -> None:
    with pytest.raises(VideoUnavailableError):
        await _call(lambda r: httpx.Response(status, text="down"), lambda c: c.result(APP))


async def test_unreadable_result_is_an_upstream_error() -> None:
    with pytest.raises(VideoUpstreamError, match="unreadable result"):
        await _call(lambda r: httpx.Response(200, text="<html>"), lambda c: c.result(APP))
