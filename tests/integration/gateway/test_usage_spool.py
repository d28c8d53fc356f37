"""The usage spool: records of answers given while Redis was frozen or down wait in the local SQLite spool and reach
Redis when it answers again, also after the gateway was SIGKILLed; each request counts once, however often its record
is replayed. Gateway processes, the Hunyuan simulator and a `redis-server` of each test's own (it is frozen or
stopped)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from gateway.keys.limiter import LocalKeyLimiter
from gateway.keys.resolver import ANONYMOUS, KeyResolver
from gateway.usage.pricing import PriceTable
from gateway.usage.record import Usage
from gateway.usage.recorder import UsageRecorder
from gateway.usage.spool import UsageSpool
from gateway.usage.store import RedisUsageStore, UsageEntry
from localtriton.ports import free_port
from tests.helpers.gateway_processes import GatewayProcess, Gateways
from tests.helpers.hunyuan_fixtures import RunningHunyuanSimulator
from tests.helpers.metrics import metric
from tests.helpers.redis_fixtures import RedisServer

pytestmark = pytest.mark.slow

ADMIN = "spool-admin-key-0001"
HEADERS = {"Authorization": f"Bearer {ADMIN}"}


def gateway_on(
    gateways: Gateways, redis: RedisServer, simulator: RunningHunyuanSimulator, tmp_path: Path, port: int
) -> GatewayProcess:
    return gateways.create(
        f"spool-{len(gateways.started)}",
        port,
        {
            "REDIS_URL": redis.url,
            "REDIS_TIMEOUT_SECONDS": "0.5",
            "REDIS_BACKOFF_SECONDS": "1",
            "GATEWAY_API_KEYS": ADMIN,
            "CHAT_BASE_URL": simulator.base_url,
            "CHAT_API_KEY": "upstream-key",
            "TASKS_SQLITE_PATH": str(tmp_path / "tasks.sqlite3"),
            "GATEWAY_USAGE_SPOOL_PATH": str(tmp_path / "usage-spool.sqlite3"),
        },
    )


def ask(http: httpx.Client, gateway: GatewayProcess, count: int, tag: str) -> int:
    """`count` chat completions, each a new question; returns how many were answered (200)."""
    answered = 0
    for n in range(count):
        body = {"model": "hy3-preview", "messages": [{"role": "user", "content": f"{tag} question {n}?"}]}
        response = http.post(f"{gateway.base_url}/v1/chat/completions", json=body, headers=HEADERS)
        assert response.status_code == 200, response.text
        answered += 1
    return answered


def recorded(http: httpx.Client, gateway: GatewayProcess) -> int | None:
    """Requests on today's usage record, or None while it cannot be read."""
    today = datetime.now(UTC).date().isoformat()
    try:
        response = http.get(f"{gateway.base_url}/v1/usage", params={"start": today, "end": today}, headers=HEADERS)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return sum(int(row["requests"]) for row in response.json()["data"])


def replayed(http: httpx.Client, gateway: GatewayProcess, expected: int) -> int | None:
    """The record once the spool is empty (the replayed records in it), waiting for the replay."""
    deadline = time.monotonic() + 60
    total = recorded(http, gateway)
    while total != expected and time.monotonic() < deadline:
        time.sleep(0.2)
        total = recorded(http, gateway)
    return total


def spool_metrics(http: httpx.Client, gateway: GatewayProcess) -> tuple[float, float]:
    spooled = metric(http, gateway.base_url, "gateway_usage_spooled_total")
    return spooled, metric(http, gateway.base_url, "gateway_usage_replayed_total")


def test_answers_given_while_redis_is_frozen_are_on_record_once_it_answers(
    own_redis: RedisServer, hunyuan_simulator: RunningHunyuanSimulator, gateways: Gateways, tmp_path: Path
) -> None:
    gateway = gateway_on(gateways, own_redis, hunyuan_simulator, tmp_path, free_port()).start()
    with httpx.Client(timeout=30) as http:
        before = ask(http, gateway, 5, "before")
        own_redis.freeze()
        try:
            during = ask(http, gateway, 20, "frozen")
            spooled, _ = spool_metrics(http, gateway)
            assert spooled > 0, "the records of the outage went to the spool"
        finally:
            own_redis.thaw()
        assert replayed(http, gateway, before + during) == before + during, gateway.tail()
        assert spool_metrics(http, gateway)[1] == spooled, "every spooled record was replayed"
        after = ask(http, gateway, 3, "after")
        assert recorded(http, gateway) == before + during + after


def test_a_killed_gateways_spool_is_replayed_at_its_next_start(
    own_redis: RedisServer, hunyuan_simulator: RunningHunyuanSimulator, gateways: Gateways, tmp_path: Path
) -> None:
    """Redis stopped (refused connections), answers given, the gateway SIGKILLed; Redis back (empty: it keeps no
    data), a new gateway on the same spool: every answer of the outage is on record."""
    port = free_port()
    gateway = gateway_on(gateways, own_redis, hunyuan_simulator, tmp_path, port).start()
    with httpx.Client(timeout=30) as http:
        own_redis.stop()
        answered = ask(http, gateway, 12, "down")
        gateway.kill()
        own_redis.start()
        restarted = gateway_on(gateways, own_redis, hunyuan_simulator, tmp_path, port).start()
        assert replayed(http, restarted, answered) == answered, restarted.tail()


async def test_a_record_replayed_twice_counts_once(own_redis: RedisServer, tmp_path: Path) -> None:
    """The same request twice in the spool, and once more after its first replay reached Redis but before it left
    the spool (a replay cut off by a kill): one request on the record."""
    store = RedisUsageStore(own_redis.url)
    spool = UsageSpool(str(tmp_path / "spool.sqlite3"), max_records=100)
    recorder = UsageRecorder(store, PriceTable({}), LocalKeyLimiter(), KeyResolver([]), spool)
    today = datetime.now(UTC).date()
    entry = UsageEntry(
        "request-1", today.isoformat(), today.isoformat()[:7], ANONYMOUS.id, "-", "t", "m", Usage(prompt_tokens=3)
    )
    await store.add_many([entry])  # the cut-off replay: in Redis, still in the spool
    await spool.put([entry, entry])
    recorder.start()
    async with asyncio.timeout(30):  # the spool is replayed
        while await spool.size():
            await asyncio.sleep(0.05)
    rows = await store.rows(today, today)
    await recorder.aclose()
    assert [row.counters["prompt_tokens"] for row in rows] == [3]
    assert sum(int(row.counters["requests"]) for row in rows) == 1


async def test_a_full_spool_drops_and_counts_the_rest(tmp_path: Path) -> None:
    spool = UsageSpool(str(tmp_path / "spool.sqlite3"), max_records=3)
    entries = [UsageEntry(f"r{n}", "2026-12-04", "2026-12", "k", "-", "t", "m", Usage()) for n in range(5)]
    dropped = await spool.put(entries)
    kept = [entry.request_id for _, entry in await spool.take(10)]
    await spool.aclose()
    reopened = UsageSpool(str(tmp_path / "spool.sqlite3"), max_records=3)
    size = await reopened.size()
    await reopened.aclose()
    assert kept == ["r0", "r1", "r2"]
    assert (dropped, size) == (2, 3)
