"""The shared Redis connection's pool, against a real Redis: a call that waits too long for a free connection
fails alone, without taking Redis for down, and the connections a burst opened are closed once idle."""

from __future__ import annotations

import asyncio

import pytest

from gateway import metrics, redis_client
from gateway.redis_client import REDIS_FAILURES, CircuitState, RedisConnection, RedisPoolBusyError


async def test_a_call_that_finds_every_connection_in_use_fails_alone_and_leaves_the_circuit_closed(
    redis_url: str,
) -> None:
    redis = RedisConnection(redis_url, timeout_seconds=0.1, max_connections=1)
    pool = redis.client.connection_pool
    busy_before = metrics.REDIS_POOL_BUSY._value.get()
    try:
        held = await pool.get_connection()  # the pool's only connection, busy for longer than the timeout
        with pytest.raises(RedisPoolBusyError) as refused:
            await redis.call(lambda: redis.client.set("pool-test", "1"))
        assert isinstance(refused.value, REDIS_FAILURES)  # each user's fallback applies to it
        assert redis.circuit.state is CircuitState.CLOSED
        assert metrics.REDIS_POOL_BUSY._value.get() == busy_before + 1

        await pool.release(held)
        assert await redis.call(lambda: redis.client.set("pool-test", "2"))  # no window to wait out
        assert await redis.call(lambda: redis.client.get("pool-test")) == b"2"
    finally:
        await redis.aclose()


async def test_a_redis_that_cannot_be_reached_still_opens_the_circuit() -> None:
    redis = RedisConnection("redis://127.0.0.1:9/0", timeout_seconds=0.1, max_connections=1)
    try:
        with pytest.raises(REDIS_FAILURES) as failed:
            await redis.call(redis.client.ping)
        assert not isinstance(failed.value, RedisPoolBusyError)
        assert redis.circuit.state is CircuitState.OPEN
    finally:
        await redis.aclose()


async def test_the_connections_a_burst_opened_are_closed_once_idle(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_client, "IDLE_CLOSE_SECONDS", 0.2)

    redis = RedisConnection(f"{redis_url}?client_name=burst", timeout_seconds=1)
    pool, client = redis.client.connection_pool, redis.client

    async def open_connections() -> int:  # as Redis counts them, the one asking included
        return sum(c["name"] == "burst" for c in await client.client_list())

    try:
        burst = [await pool.get_connection() for _ in range(10)]  # e.g. every waiting call after an outage
        for connection in burst:
            await pool.release(connection)
        assert await open_connections() == 10
        await asyncio.sleep(0.3)
        assert await client.ping()  # the release after the idle time closes them; the one in use stays
        for _ in range(20):  # Redis reads the closes in its next turns
            if await open_connections() == 1:
                break
            await asyncio.sleep(0.05)
        assert await open_connections() == 1
    finally:
        await redis.aclose()
