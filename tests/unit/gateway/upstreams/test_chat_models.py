"""ChatClient.models: the upstream's GET /models, against a local aiohttp server; errors in the gateway's classes."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from aiohttp import web
from pydantic import SecretStr

from gateway.errors import GatewayError, UpstreamError
from gateway.settings import ChatSettings
from gateway.upstreams.chat import ChatClient, ChatNotConfiguredError, ChatUnavailableError, ChatUpstreamError

KEY = "hy-secret-key-5678"
ENTRIES = [{"id": "hy3-preview", "object": "model", "created": 1, "owned_by": "tencent"}]


async def _models_against(status: int, body: Any) -> tuple[list[dict[str, Any]] | GatewayError, list[str]]:
    """What `models()` returns (or raises) when the upstream answers `status` with `body`, and the
    Authorization headers the upstream saw."""
    seen: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        text = body if isinstance(body, str) else json.dumps(body)
        return web.Response(status=status, text=text, content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/models", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.SockSite(runner, socket.create_server(("127.0.0.1", 0)))
    await site.start()
    port = int(runner.addresses[0][1])
    settings = ChatSettings(base_url=f"http://127.0.0.1:{port}/v1/", api_key=SecretStr(KEY))
    try:
        async with ChatClient(settings) as client:
            return await client.models(), seen
    except GatewayError as raised:
        return raised, seen
    finally:
        await runner.cleanup()


async def test_lists_the_upstreams_entries_with_the_key() -> None:
    listed, seen = await _models_against(200, {"object": "list", "data": [*ENTRIES, {"object": "model"}, "junk"]})
    assert listed == ENTRIES  # entries without an id are dropped
    assert seen == [f"Bearer {KEY}"]


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (401, {"error": {"message": f"invalid key {KEY}"}}, ChatUpstreamError),
        (503, {"error": {"message": "overloaded"}}, ChatUnavailableError),
        (200, "not json", ChatUpstreamError),
        (200, {"object": "list"}, ChatUpstreamError),
    ],
    ids=["rejected-key", "unavailable", "not-json", "no-data"],
)
async def test_failures_are_upstream_errors_without_the_key(status: int, body: Any, error: type[UpstreamError]) -> None:
    raised, seen = await _models_against(status, body)
    assert isinstance(raised, error), raised
    assert KEY not in str(raised)
    assert len(seen) == 1  # one attempt: a listing is not retried


async def test_an_unreachable_upstream_is_unavailable() -> None:
    with socket.create_server(("127.0.0.1", 0)) as reserved:
        port = reserved.getsockname()[1]
    settings = ChatSettings(base_url=f"http://127.0.0.1:{port}/v1", api_key=SecretStr(KEY))
    with pytest.raises(ChatUnavailableError):
        async with ChatClient(settings) as client:
            await client.models()


async def test_without_a_key_it_is_not_configured() -> None:
    with pytest.raises(ChatNotConfiguredError, match="CHAT_API_KEY"):
        async with ChatClient(ChatSettings(base_url="http://127.0.0.1:1/v1", api_key=None)) as client:
            await client.models()
