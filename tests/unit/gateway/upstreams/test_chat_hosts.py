"""The chat upstream's hosts: order, one breaker per host, and ChatClient's failover between local aiohttp servers."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import REGISTRY
from pydantic import SecretStr

from gateway.errors import UpstreamError, UpstreamUnavailableError
from gateway.settings import ChatSettings
from gateway.upstreams.breaker import BreakerState
from gateway.upstreams.chat import ChatClient
from gateway.upstreams.chat_hosts import ChatHosts, host_name
from localtriton.ports import free_port

COMPLETION = {"object": "chat.completion", "choices": [{"index": 0, "message": {"content": "hi"}}]}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def settings(*urls: str, **overrides: Any) -> ChatSettings:
    values: dict[str, Any] = {
        "base_url": urls[0],
        "backup_base_urls": ",".join(urls[1:]),
        "api_key": SecretStr("k"),
        "retry_base_seconds": 0.001,
        "breaker_failures": 2,
        "breaker_reset_seconds": 10.0,
    }
    return ChatSettings(**{**values, **overrides})


def test_base_urls_are_the_primary_then_the_backups_each_once() -> None:
    configured = settings("https://a.example/v1/", " https://b.example/v1 ", "", "https://a.example/v1")
    assert configured.base_urls() == ["https://a.example/v1", "https://b.example/v1"]
    assert host_name("https://user:secret@tokenhub.tencentmaas.com/v1") == "tokenhub.tencentmaas.com"
    assert host_name("http://127.0.0.1:8081/v1") == "127.0.0.1:8081"


def test_an_open_host_is_skipped_and_a_later_host_tried_until_its_probe() -> None:
    clock = Clock()
    hosts = ChatHosts(settings("https://a.example/v1", "https://b.example/v1"), clock=clock)
    primary, backup = list(hosts)
    for _ in range(2):
        primary.breaker.record_failure()
    assert primary.breaker.state is BreakerState.OPEN and backup.breaker.state is BreakerState.CLOSED
    assert [host.name for host in hosts.allowed()] == ["b.example"]
    assert hosts.preferred() is backup
    for _ in range(2):
        backup.breaker.record_failure()
    assert list(hosts.allowed()) == [] and hosts.retry_after_seconds() == 10
    clock.now += 10.0
    allowed = hosts.allowed()
    assert next(allowed) is primary  # its probe; the backup's breaker is not asked until the primary fails
    assert (primary.breaker.state.value, backup.breaker.state.value) == ("half_open", "open")


@asynccontextmanager
async def server(status: int = 200) -> AsyncIterator[tuple[str, list[int]]]:
    """A local upstream answering `status` (TokenHub's error body) or a completion; yields its base URL and
    a list that grows by one per request."""
    calls: list[int] = []

    async def answer(request: web.Request) -> web.Response:
        calls.append(1)
        if status >= 400:
            body = {"error": {"message": "busy", "type": "server_error", "code": "x", "source": "upstream"}}
            return web.Response(status=status, text=json.dumps(body), content_type="application/json")
        return web.json_response(COMPLETION)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.SockSite(runner, socket.create_server(("127.0.0.1", 0))).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1", calls
    finally:
        await runner.cleanup()


def calls_counted(host: str) -> float:
    return REGISTRY.get_sample_value("gateway_chat_upstream_calls_total", {"model": "m", "host": host}) or 0.0


async def test_a_refused_or_5xx_primary_falls_over_to_the_backup_within_one_attempt_and_the_metric_names_it() -> None:
    refused = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    async with server(503) as (failing, failing_calls), server() as (backup, backup_calls):
        before = calls_counted(host_name(backup))
        async with ChatClient(settings(refused, failing, backup, max_retries=0)) as client:
            assert await client.complete({"model": "m", "messages": []}) == COMPLETION
            assert failing_calls == [1] and backup_calls == [1]
            assert calls_counted(host_name(backup)) == before + 1 and calls_counted(host_name(failing)) == 0
            await client.complete({"model": "m", "messages": []})  # the second failure opens both breakers
            assert failing_calls == [1, 1]
            await client.complete({"model": "m", "messages": []})
            assert failing_calls == [1, 1] and backup_calls == [1, 1, 1]  # open hosts are not asked


async def test_when_every_host_fails_the_attempt_is_retried_and_then_every_breaker_open_fails_fast() -> None:
    async with (
        server(500) as (first, first_calls),
        server(502) as (second, second_calls),
        ChatClient(settings(first, second, max_retries=1)) as client,
    ):
        with pytest.raises(UpstreamUnavailableError):  # the last host's 502
            await client.complete({"model": "m", "messages": []})
        assert first_calls == [1, 1] and second_calls == [1, 1]  # two attempts over both hosts
        with pytest.raises(UpstreamUnavailableError, match="every chat upstream host is failing") as fast:
            await client.complete({"model": "m", "messages": []})
        assert fast.value.headers["Retry-After"] == "10" and len(first_calls) == 2


async def test_a_429_is_the_accounts_and_does_not_move_to_the_next_host() -> None:
    async with (
        server(429) as (limited, limited_calls),
        server() as (backup, backup_calls),
        ChatClient(settings(limited, backup, max_retries=0)) as client,
    ):
        with pytest.raises(Exception, match="quota exceeded"):
            await client.complete({"model": "m", "messages": []})
    assert limited_calls == [1] and backup_calls == []


async def test_a_single_host_is_never_skipped_its_models_breakers_fail_fast_instead() -> None:
    async with server(500) as (only, calls), ChatClient(settings(only, max_retries=0)) as client:
        for _ in range(3):
            with pytest.raises(UpstreamError, match="500"):
                await client.complete({"model": "m", "messages": []})
    assert calls == [1, 1, 1]
