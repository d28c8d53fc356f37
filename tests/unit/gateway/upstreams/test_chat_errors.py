"""ChatClient's reading of upstream errors, against a local aiohttp server that answers each test's error."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from aiohttp import web
from pydantic import SecretStr

from gateway.errors import GatewayError, InvalidRequestError
from gateway.settings import ChatSettings
from gateway.upstreams.chat import ChatClient, ChatUpstreamError

KEY = "hy-secret-key-5678"


async def _complete_against(status: int, error: dict[str, Any]) -> GatewayError:
    """The error ChatClient raises when every attempt is answered `status` with `error` as the body."""

    async def answer(request: web.Request) -> web.Response:
        return web.Response(status=status, text=json.dumps({"error": error}), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.SockSite(runner, socket.create_server(("127.0.0.1", 0)))
    await site.start()
    port = int(runner.addresses[0][1])
    settings = ChatSettings(
        base_url=f"http://127.0.0.1:{port}/v1", api_key=SecretStr(KEY), max_retries=1, retry_base_seconds=0.001
    )
    try:
        async with ChatClient(settings) as client:
            await client.complete({"model": "m", "messages": []})
    except GatewayError as raised:
        return raised
    finally:
        await runner.cleanup()
    raise AssertionError("the upstream's error was not raised")


@pytest.mark.parametrize("status", [400, 404, 429, 500, 503])
async def test_a_key_echoed_by_the_upstream_is_redacted(status: int) -> None:
    raised = await _complete_against(status, {"message": f"bad header Authorization: Bearer {KEY}", "code": "x"})
    shown = json.dumps(raised.body())
    assert KEY not in shown and KEY not in str(raised)
    assert "Bearer ***" in shown


async def test_a_refusal_keeps_the_upstream_message_and_code() -> None:
    raised = await _complete_against(400, {"message": "max_tokens is too large", "code": "invalid_max_tokens"})
    assert isinstance(raised, InvalidRequestError) and raised.status_code == 400
    assert raised.body()["error"]["code"] == "invalid_max_tokens"
    assert "max_tokens is too large" in raised.body()["error"]["message"]


async def test_rejected_credentials_name_the_variable() -> None:
    raised = await _complete_against(401, {"message": f"invalid key {KEY}", "code": "invalid_api_key"})
    assert isinstance(raised, ChatUpstreamError) and "CHAT_API_KEY" in str(raised) and KEY not in str(raised)
