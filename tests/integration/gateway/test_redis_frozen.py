"""A Redis that stops answering (SIGSTOP: a hung node, a partition) behind the real gateway, Triton and the Hunyuan
simulator: the Redis circuit skips it, so only the request waiting on Redis when it froze waits out a timeout (the
probe after each back-off window runs in the background); readiness answers from the last known state; the
outage is logged once; everything recovers after SIGCONT.

Each test freezes a `redis-server` of its own, so other tests' Redis is never stopped."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from pydantic import SecretStr

from gateway.settings import HunyuanSettings, RedisSettings
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
        hunyuan=HunyuanSettings(base_url=hunyuan_simulator.base_url, api_key=SecretStr("sim-key")),
        redis=RedisSettings(url=SecretStr(own_redis.url), timeout_seconds=TIMEOUT, backoff_seconds=BACKOFF),
    )


class Traffic:
    """Embeddings and chat requests in turn, each with a new text (no cache hit hides Redis), timed."""

    def __init__(self, http: httpx.Client, gateway: RunningGateway, tag: str) -> None:
        self.http, self.gateway, self.tag = http, gateway, tag
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
        status = self.http.post(f"{self.gateway.base_url}{path}", json=body).status_code
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
