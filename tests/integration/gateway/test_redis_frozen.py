"""A Redis that stops answering (SIGSTOP: a hung node, a partition) behind the real gateway, Triton and the Hunyuan
simulator: the Redis circuit skips it, so only the request waiting on Redis when it froze waits out a timeout (the
probe after each back-off window runs in the background); readiness answers from the last known state; the
outage is logged once; everything recovers after SIGCONT. Keys with limits (their limits, key store and usage
record on the same circuit) are no exception.

Each test freezes a `redis-server` of its own, so other tests' Redis is never stopped."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from gateway.settings import AuthSettings, ChatSettings, RedisSettings
from localtriton.server import TritonProcess
from tests.helpers.hunyuan_fixtures import RunningHunyuanSimulator
from tests.helpers.redis_fixtures import RedisServer
from tests.helpers.running_gateway import RunningGateway

pytestmark = pytest.mark.slow

TIMEOUT = 0.5  # REDIS_TIMEOUT_SECONDS: long next to a served request, so a slowed one stands out on a busy host
BACKOFF = 1.0  # REDIS_BACKOFF_SECONDS
FROZEN_SECONDS = 5.0
# A request slowed by the frozen Redis waited out at least one socket timeout.
SLOWED = 0.9 * TIMEOUT
SECRET = "sk-frozen-redis-limited-0001"
# Limits no test traffic reaches: every request runs the limit script (and chat reserves tokens and a slot).
KEYS_FILE = f"""
keys:
  - name: limited
    team: frozen
    secret: {SECRET}
    limits: {{requests_per_minute: 100000, chat_tokens_per_minute: 10000000, concurrent_chat_streams: 100}}
teams:
  frozen: {{requests_per_minute: 100000, monthly_budget: {{tokens: 1000000000}}}}
"""


@pytest.fixture
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("frozen-redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def gateway(
    own_redis: RedisServer,
    hunyuan_simulator: RunningHunyuanSimulator,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
) -> RunningGateway:
    return gateway_factory(
        triton.grpc_url,
        chat=ChatSettings(base_url=hunyuan_simulator.base_url, api_key=SecretStr("sim-key")),
        redis=RedisSettings(url=SecretStr(own_redis.url), timeout_seconds=TIMEOUT, backoff_seconds=BACKOFF),
    )


@pytest.fixture
def keyed_gateway(
    own_redis: RedisServer,
    hunyuan_simulator: RunningHunyuanSimulator,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> RunningGateway:
    """A gateway whose only key has limits: its checks, key store and usage record are on Redis."""
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(KEYS_FILE)
    return gateway_factory(
        triton.grpc_url,
        chat=ChatSettings(base_url=hunyuan_simulator.base_url, api_key=SecretStr("sim-key")),
        redis=RedisSettings(url=SecretStr(own_redis.url), timeout_seconds=TIMEOUT, backoff_seconds=BACKOFF),
        auth=AuthSettings(keys_file=str(keys_file), keys_sqlite_path=str(tmp_path / "keys.sqlite3")),
    )


class Traffic:
    """Embeddings and chat requests in turn, each with a new text (no cache hit hides Redis), timed."""

    def __init__(self, http: httpx.Client, gateway: RunningGateway, tag: str, secret: str | None = None) -> None:
        self.http, self.gateway, self.tag = http, gateway, tag
        self.headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        self.count = 0

    def one(self) -> tuple[int, float]:
        self.count += 1
        text = f"{self.tag} question number {self.count}?"
        if self.count % 2:
            path, body = "/v1/embeddings", {"input": text}
        else:
            path, body = (
                "/v1/chat/completions",
                {"model": "hy3-preview", "messages": [{"role": "user", "content": text}]},
            )
        started = time.monotonic()
        status = self.http.post(f"{self.gateway.base_url}{path}", json=body, headers=self.headers).status_code
        return status, time.monotonic() - started

    def for_seconds(self, seconds: float) -> list[tuple[int, float]]:
        until = time.monotonic() + seconds
        answers = []
        while time.monotonic() < until:
            answers.append(self.one())
        return answers


def readiness(http: httpx.Client, gateway: RunningGateway) -> tuple[dict[str, object], float]:
    started = time.monotonic()
    body = http.get(f"{gateway.base_url}/readyz").json()
    return body, time.monotonic() - started


def test_a_frozen_redis_slows_only_the_request_that_found_it_frozen(
    own_redis: RedisServer, gateway: RunningGateway, http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    traffic = Traffic(http, gateway, "frozen")
    assert all(status == 200 for status, _ in traffic.for_seconds(1.0))  # warm: every client has connected
    with caplog.at_level(logging.INFO, logger="gateway"):
        own_redis.freeze()
        try:
            frozen = traffic.for_seconds(FROZEN_SECONDS)
            ready, ready_seconds = readiness(http, gateway)
            metrics = http.get(f"{gateway.base_url}/metrics").text
        finally:
            own_redis.thaw()
        deadline = time.monotonic() + 10 * BACKOFF
        while readiness(http, gateway)[0]["checks"] != {
            "triton": "ok",
            "cache": "ok",
            "tasks": "ok",
            "redis": "ok",
            "search": "ok",
        }:
            assert time.monotonic() < deadline, "the Redis circuit did not close after SIGCONT"
            traffic.one()
            time.sleep(0.05)
    slowed = [seconds for _, seconds in frozen if seconds >= SLOWED]
    print(f"\nfrozen {FROZEN_SECONDS} s: {len(frozen)} requests, {len(slowed)} slowed: {sorted(slowed)}")
    print(f"readyz while frozen: {ready_seconds * 1000:.1f} ms")
    assert all(status == 200 for status, _ in frozen)
    assert len(frozen) >= 10
    assert len(slowed) <= 2  # the one that found the freeze (sequential traffic), none per window
    assert max(seconds for _, seconds in frozen) < 2 * TIMEOUT + 1.0  # the call deadline, with room for a busy host
    assert ready == {
        "ready": True,
        "checks": {"triton": "ok", "cache": "degraded", "tasks": "unavailable", "redis": "degraded", "search": "ok"},
    }
    assert ready_seconds < TIMEOUT  # from the circuit's last known state, never waiting on Redis
    assert 'gateway_redis_circuit_open{client="redis"} 1.0' in metrics
    logged = [(record.levelno, record.getMessage()) for record in caplog.records]
    print(f"log lines at WARNING or above during the outage: {sum(level >= logging.WARNING for level, _ in logged)}")
    assert [level for level, message in logged if "does not answer" in message] == [logging.WARNING]
    assert [level for level, message in logged if "answers again" in message] == [logging.INFO]
    assert sum(level >= logging.WARNING for level, _ in logged) <= 2  # not one per request


def test_after_sigcont_the_caches_serve_from_redis_again(
    own_redis: RedisServer, gateway: RunningGateway, http: httpx.Client
) -> None:
    url = f"{gateway.base_url}/v1/embeddings"
    own_redis.freeze()
    try:
        assert http.post(url, json={"input": "frozen then thawed"}).headers["x-cache"] == "miss"
    finally:
        own_redis.thaw()
    time.sleep(BACKOFF)  # the window ends; the next call probes Redis and closes the circuit
    http.post(url, json={"input": "frozen then thawed"})
    assert http.post(url, json={"input": "frozen then thawed"}).headers["x-cache"] == "hit"


def test_keys_with_limits_are_slowed_only_by_the_freeze_itself(
    own_redis: RedisServer, keyed_gateway: RunningGateway, http: httpx.Client
) -> None:
    """The limit checks fall back to this replica's own at once while the circuit is open, the usage record
    (which chat answers wait for) fails at once, and the key store keeps the keys it holds."""
    traffic = Traffic(http, keyed_gateway, "limited", SECRET)
    assert all(status == 200 for status, _ in traffic.for_seconds(1.0))
    own_redis.freeze()
    try:
        frozen = traffic.for_seconds(FROZEN_SECONDS)
    finally:
        own_redis.thaw()
    slowed = [seconds for _, seconds in frozen if seconds >= SLOWED]
    print(f"\nfrozen {FROZEN_SECONDS} s with limited keys: {len(frozen)} requests, {len(slowed)} slowed")
    assert all(status == 200 for status, _ in frozen)
    assert len(frozen) >= 10
    assert len(slowed) <= 2  # the one that found the freeze (sequential traffic), none per window
    assert max(seconds for _, seconds in frozen) < 2 * TIMEOUT + 1.0
    deadline = time.monotonic() + 10 * BACKOFF
    while readiness(http, keyed_gateway)[0]["checks"].get("redis") != "ok":  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the Redis circuit did not close after SIGCONT"
        traffic.one()
        time.sleep(0.05)
    today = datetime.now(UTC).date().isoformat()
    usage = http.get(
        f"{keyed_gateway.base_url}/v1/usage", params={"start": today, "end": today}, headers=traffic.headers
    )
    assert usage.status_code == 200
    assert sum(row["requests"] for row in usage.json()["data"]) > 0  # the answers outside the outage are on record
