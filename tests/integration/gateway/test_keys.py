"""Keys with identity on one real gateway: the keys file and its reloads, scopes, the admin API, expiry and
revocation, budgets, the usage record; secrets never in answers, logs, metrics or usage."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from pydantic import SecretStr

from gateway.grpc.pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.keys.model import hash_secret
from gateway.settings import (
    AuthSettings,
    ChatQuotaSettings,
    ChatSettings,
    ModelPrice,
    RedisSettings,
    UsageSettings,
)
from tests.helpers.conditions import wait_until
from tests.helpers.hunyuan_fixtures import RunningHunyuanSimulator
from tests.helpers.metrics import metric
from tests.helpers.redis_fixtures import RedisServer
from tests.helpers.running_gateway import RunningGateway

ADMIN = "admin-bootstrap-key-0001"
NO_TRITON = "127.0.0.1:1"  # nothing here needs embeddings
CHAT = {"model": "hy3-preview", "messages": [{"role": "user", "content": "hello there"}]}


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def start(
    gateway_factory: Callable[..., RunningGateway], hunyuan_simulator: RunningHunyuanSimulator
) -> Iterator[Callable[..., RunningGateway]]:
    hunyuan_simulator.config.api_key = "upstream-key"

    def started(concerns: dict[str, Any] | None = None, **auth: Any) -> RunningGateway:
        return gateway_factory(NO_TRITON, **{**defaults(auth), **(concerns or {})})

    def defaults(auth: dict[str, Any]) -> dict[str, Any]:
        return {
            "auth": AuthSettings(api_keys=SecretStr(ADMIN), keys_refresh_seconds=0.05, **auth),
            "chat": ChatSettings(base_url=hunyuan_simulator.base_url, api_key=SecretStr("upstream-key")),
        }

    yield started


def create_key(http: httpx.Client, gateway: RunningGateway, **body: Any) -> dict[str, Any]:
    response = http.post(f"{gateway.base_url}/v1/admin/keys", json=body, headers=bearer(ADMIN))
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def test_keys_file_scopes_reloads_and_keeps_the_old_keys_on_a_syntax_error(
    start: Callable[..., RunningGateway], http: httpx.Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    embed_only, chatty = "sk-file-embeddings-only-0001", "sk-file-chat-key-0002"
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(
        f"keys:\n  - {{name: indexer, team: search, secret_sha256: {hash_secret(embed_only)}, scopes: [embeddings]}}\n"
    )
    gateway = start(keys_file=str(keys_file))
    url = gateway.base_url
    refused = http.post(f"{url}/v1/chat/completions", json=CHAT, headers=bearer(embed_only))
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["type"] == "permission_error"
    assert "'chat'" in refused.json()["error"]["message"] and embed_only not in refused.text
    assert http.get(f"{url}/v1/admin/keys", headers=bearer(embed_only)).status_code == 403
    assert http.get(f"{url}/v1/models", headers=bearer(embed_only)).status_code == 200  # needs no scope
    assert http.get(f"{url}/v1/models", headers=bearer(chatty)).status_code == 401

    keys_file.write_text(
        "teams:\n  research: {limits: {requests_per_minute: 600000}}\n"
        f"keys:\n  - {{name: bot, team: research, secret: {chatty}, scopes: [chat]}}\n"
    )
    wait_until(lambda: http.get(f"{url}/v1/models", headers=bearer(chatty)).status_code == 200)
    assert http.get(f"{url}/v1/models", headers=bearer(embed_only)).status_code == 401  # gone from the file
    assert http.post(f"{url}/v1/chat/completions", json=CHAT, headers=bearer(chatty)).status_code == 200

    with caplog.at_level(logging.WARNING, logger="gateway.keys.resolver"):
        keys_file.write_text(f"keys:\n  - {{name: bot, team: research, secret: {chatty}, scopes: [chat\n")
        wait_until(lambda: "not loaded" in caplog.text)
    assert "not valid YAML at line" in caplog.text
    assert chatty not in caplog.text  # the file's content is never quoted
    assert http.get(f"{url}/v1/models", headers=bearer(chatty)).status_code == 200  # the previous keys stay


def test_admin_api_creates_lists_and_revokes_keys(start: Callable[..., RunningGateway], http: httpx.Client) -> None:
    gateway = start()
    url = gateway.base_url
    created = create_key(
        http, gateway, name="search-prod", team="search", scopes=["chat"], limits={"videos_per_day": 3}
    )
    assert set(created) >= {"id", "key", "prefix", "name", "team", "scopes", "limits", "created_at", "expires_at"}
    secret = created["key"]
    assert secret.startswith("sk-") and created["prefix"] == f"sk-…{secret[-4:]}"
    assert created["scopes"] == ["chat"] and created["limits"] == {"videos_per_day": 3}
    listed = http.get(f"{url}/v1/admin/keys", headers=bearer(ADMIN))
    assert listed.status_code == 200 and secret not in listed.text and hash_secret(secret) not in listed.text
    assert created["id"] in {k["id"] for k in listed.json()["data"]}
    assert http.get(f"{url}/v1/admin/keys", headers=bearer(secret)).status_code == 403  # not an admin key
    assert http.post(f"{url}/v1/chat/completions", json=CHAT, headers=bearer(secret)).status_code == 200

    deleted = http.delete(f"{url}/v1/admin/keys/{created['id']}", headers=bearer(ADMIN))
    assert deleted.json() == {"id": created["id"], "deleted": True}
    revoked = http.post(f"{url}/v1/chat/completions", json=CHAT, headers=bearer(secret))
    assert revoked.status_code == 401 and "revoked" in revoked.json()["error"]["message"]
    assert secret not in revoked.text

    expired = create_key(http, gateway, name="old", team="search", expires_at="2020-01-01T00:00:00Z")
    answer = http.get(f"{url}/v1/models", headers=bearer(expired["key"]))
    assert answer.status_code == 401 and "expired" in answer.json()["error"]["message"]
    team_limits = {"limits": {"concurrent_chat_streams": 2}}
    team = http.put(f"{url}/v1/admin/teams/search", json=team_limits, headers=bearer(ADMIN))
    assert team.status_code == 200 and team.json() == {"team": "search", **team_limits}


@pytest.mark.parametrize("with_redis", [False, True])
def test_a_spent_budget_answers_insufficient_quota_and_usage_is_recorded(
    start: Callable[..., RunningGateway],
    http: httpx.Client,
    request: pytest.FixtureRequest,
    with_redis: bool,
) -> None:
    concerns: dict[str, Any] = {"usage": UsageSettings(prices={"hy3-preview": ModelPrice(input=1000, output=1000)})}
    if with_redis:
        concerns["redis"] = RedisSettings(url=SecretStr(request.getfixturevalue("redis_url")))
    gateway = start(concerns=concerns)
    url = gateway.base_url
    created = create_key(http, gateway, name="spender", team="growth", limits={"monthly_budget": 0.001})
    first = http.post(f"{url}/v1/chat/completions", json=CHAT, headers=bearer(created["key"]))
    assert first.status_code == 200, first.text
    usage = first.json()["usage"]
    expected_cost = (usage["prompt_tokens"] + usage["completion_tokens"]) * 1000 / 1e6
    assert float(first.headers["x-request-cost"]) == pytest.approx(expected_cost)

    # A chat answer is on record before it is sent: the very next request finds the budget spent.
    answer = http.post(f"{url}/v1/chat/completions", json=CHAT, headers=bearer(created["key"]))
    assert answer.status_code == 429, answer.text
    assert answer.json()["error"]["code"] == "insufficient_quota" and int(answer.headers["retry-after"]) >= 1

    day = time.strftime("%Y-%m-%d", time.gmtime())
    mine = http.get(f"{url}/v1/usage", params={"start": day, "end": day}, headers=bearer(created["key"]))
    assert mine.status_code == 200, mine.text
    rows = mine.json()["data"]
    assert len(rows) == 1 and rows[0]["key_prefix"] == created["prefix"] and rows[0]["requests"] == 1
    assert rows[0]["prompt_tokens"] == usage["prompt_tokens"] and rows[0]["cost"] == pytest.approx(expected_cost)
    by_team = http.get(
        f"{url}/v1/usage", params={"start": day, "end": day, "group_by": "team"}, headers=bearer(ADMIN)
    ).json()["data"]
    assert {r["team"] for r in by_team} == {"growth"} and "key_prefix" not in by_team[0] and "model" not in by_team[0]
    as_csv = http.get(
        f"{url}/v1/usage", params={"start": day, "end": day}, headers={**bearer(ADMIN), "Accept": "text/csv"}
    )
    assert as_csv.headers["content-type"].startswith("text/csv") and "growth" in as_csv.text
    assert created["key"] not in as_csv.text and created["key"] not in json.dumps(by_team)
    metrics = http.get(f"{url}/metrics").text
    assert 'gateway_usage_requests_total{team="growth"}' in metrics and created["key"] not in metrics


def test_grpc_checks_the_same_keys_and_scopes(start: Callable[..., RunningGateway], http: httpx.Client) -> None:
    gateway = start()
    chat_only = create_key(http, gateway, name="chat-bot", team="apps", scopes=["chat"])
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        embeddings = gateway_pb2_grpc.EmbeddingsStub(channel)
        with pytest.raises(grpc.RpcError) as denied:
            embeddings.Embed(
                gateway_pb2.EmbedRequest(input=["hi"]), metadata=[("authorization", f"Bearer {chat_only['key']}")]
            )
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'embeddings'" in denied.value.details() and chat_only["key"] not in denied.value.details()
        models = gateway_pb2_grpc.ModelsStub(channel)
        models.List(gateway_pb2.ListModelsRequest(), metadata=[("authorization", f"Bearer {chat_only['key']}")])
        http.delete(f"{gateway.base_url}/v1/admin/keys/{chat_only['id']}", headers=bearer(ADMIN))
        with pytest.raises(grpc.RpcError) as revoked:
            models.List(gateway_pb2.ListModelsRequest(), metadata=[("authorization", f"Bearer {chat_only['key']}")])
        assert revoked.value.code() == grpc.StatusCode.UNAUTHENTICATED and "revoked" in revoked.value.details()

        chatter = create_key(http, gateway, name="grpc-chat", team="apps", scopes=["chat"])
        chat = gateway_pb2_grpc.ChatStub(channel)
        request = gateway_pb2.ChatRequest(body_json=json.dumps(CHAT))
        chunks = list(chat.Complete(request, metadata=[("authorization", f"Bearer {chatter['key']}")]))
        assert chunks and any(chunk.content for chunk in chunks)
    day = time.strftime("%Y-%m-%d", time.gmtime())

    def recorded() -> bool:
        answer = http.get(
            f"{gateway.base_url}/v1/usage", params={"start": day, "end": day}, headers=bearer(chatter["key"])
        )
        return [r["requests"] for r in answer.json()["data"]] == [1]

    wait_until(recorded)  # the gRPC stream's usage is recorded as the REST one's


async def test_a_team_at_its_stream_limit_leaves_the_accounts_slots_to_the_others(
    start: Callable[..., RunningGateway], hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client, tmp_path: Path
) -> None:
    """Team busy (2 concurrent streams) floods with 8 callers; team quiet (no limit of its own) sends 2 at a time.
    The account allows 4 calls at once: busy's extra streams are refused by busy's own limit before they queue for
    the account's quota, so they never hold or wait for an account slot, and quiet's streams all get slots."""
    hunyuan_simulator.config.ttft_seconds = 0.3  # calls last long enough to overlap
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(
        "teams:\n  busy: {limits: {concurrent_chat_streams: 2}}\n"
        "keys:\n  - {name: a, team: busy, secret: sk-team-busy-key-0001}\n"
        "  - {name: b, team: quiet, secret: sk-team-quiet-key-0002}\n"
    )
    quota = ChatQuotaSettings(requests_per_second=1000, max_concurrent=4, max_wait_seconds=30)
    chat = ChatSettings(base_url=hunyuan_simulator.base_url, api_key=SecretStr("upstream-key"), quota=quota)
    gateway = start(keys_file=str(keys_file), concerns={"chat": chat})
    # The metrics are the test process's (gateways run in it), so earlier tests' waits are counted before.
    concurrency_waits = {"limiter": "chat", "reason": "concurrency"}
    waits_before = metric(http, gateway.base_url, "gateway_quota_waits_total", **concurrency_waits)
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as client:

        async def caller(team: str, secret: str, n: int, requests: int) -> list[httpx.Response]:
            answers = []
            for i in range(requests):
                # `user` (forwarded upstream) tells the simulator whose call holds each of its slots.
                content = f"question {team} {n} {i}"
                body = {**CHAT, "stream": True, "user": team, "messages": [{"role": "user", "content": content}]}
                answers.append(await client.post("/v1/chat/completions", json=body, headers=bearer(secret)))
            return answers

        busy_callers = [caller("busy", "sk-team-busy-key-0001", n, 6) for n in range(8)]
        quiet_callers = [caller("quiet", "sk-team-quiet-key-0002", n, 4) for n in range(2)]
        answers = await asyncio.gather(*busy_callers, *quiet_callers)
    busy, quiet = [a for group in answers[:8] for a in group], [a for group in answers[8:] for a in group]
    assert [a.status_code for a in quiet] == [200] * 8, [a.text for a in quiet if a.status_code != 200]
    assert all(a.text.endswith("data: [DONE]\n\n") for a in quiet)  # served in full, not refused mid-way
    refused = [a for a in busy if a.status_code == 429]
    assert refused and len(refused) + sum(a.status_code == 200 for a in busy) == len(busy)
    for answer in refused:  # refused by its own limit, never by the account's quota
        error = answer.json()["error"]
        assert error["code"] == "rate_limit_exceeded" and "team 'busy'" in error["message"], error
        assert "concurrent chat streams" in error["message"]
    stats = hunyuan_simulator.stats
    assert stats.max_in_flight_by_user["busy"] <= 2  # busy never held more than its own limit of account slots
    assert stats.max_in_flight_by_user["quiet"] == 2  # quiet got both of its slots at once while busy flooded
    assert stats.max_in_flight <= 4 and stats.rate_limited == 0
    # 2 of busy's and 2 of quiet's fit the account's 4 at once: no call ever waited for a slot to free.
    assert metric(http, gateway.base_url, "gateway_quota_waits_total", **concurrency_waits) == waits_before


def test_a_redis_outage_keeps_the_keys_in_force_and_the_admin_api_answers_503(
    start: Callable[..., RunningGateway], http: httpx.Client, redis_server: RedisServer, redis_url: str
) -> None:
    gateway = start(concerns={"redis": RedisSettings(url=SecretStr(redis_url))})
    url = gateway.base_url
    created = create_key(http, gateway, name="steady", team="search", limits={"requests_per_minute": 600000})
    redis_server.stop()
    try:
        assert http.get(f"{url}/v1/models", headers=bearer(created["key"])).status_code == 200  # limited alone
        refused = http.post(f"{url}/v1/admin/keys", json={"name": "n", "team": "t"}, headers=bearer(ADMIN))
        assert refused.status_code == 503 and redis_url not in refused.text
        assert "invalid API key" in http.get(f"{url}/v1/models", headers=bearer("sk-unknown-key-00000")).text
    finally:
        redis_server.start()
    # The Redis circuit skips Redis for its back-off window after the outage: the admin API answers 503 until then.
    deadline = time.monotonic() + 5.0
    body = {"name": "after", "team": "search"}
    while (again := http.post(f"{url}/v1/admin/keys", json=body, headers=bearer(ADMIN))).status_code == 503:
        assert time.monotonic() < deadline, "the admin API did not recover after Redis came back"
        time.sleep(0.05)
    assert again.status_code == 201, again.text
    wait_until(lambda: status_of(http, url, again.json()["key"]) == 200)


def status_of(http: httpx.Client, url: str, secret: str) -> int:
    return http.get(f"{url}/v1/models", headers=bearer(secret)).status_code
