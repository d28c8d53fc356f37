"""The shared Redis connection's pool, against a real Redis: a call that waits too long for a free connection
fails alone, without taking Redis for down."""

from __future__ import annotations

import asyncio

import pytest

from gateway import metrics
from gateway.redis_client import REDIS_FAILURES, CircuitState, RedisConnection, RedisPoolBusyError


def test_a_call_that_finds_every_connection_in_use_fails_alone_and_leaves_the_circuit_closed(
    redis_url: str,
) -> None:
    async def scenario() -> None:
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

    asyncio.run(scenario())


def test_a_redis_that_cannot_be_reached_still_opens_the_circuit() -> None:
    async def scenario() -> None:
        redis = RedisConnection("redis://127.0.0.1:9/0", timeout_seconds=0.1, max_connections=1)
        try:
            with pytest.raises(REDIS_FAILURES) as failed:
                await redis.call(redis.client.ping)
            assert not isinstance(failed.value, RedisPoolBusyError)
            assert redis.circuit.state is CircuitState.OPEN
        finally:
            await redis.aclose()

    asyncio.run(scenario())
