"""The shared Redis connection when this process, not Redis, is slow: against a real `redis-server`, calls whose
answers sat unread while the event loop was starved (blocked, as a process short of CPU is) fail alone, the pool
they emptied refuses its waiters alone, and the circuit stays closed for the next call; a Redis that really stops
answering (SIGSTOP) still opens it."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from gateway import metrics
from gateway.redis_client import REDIS_FAILURES, TIMEOUTS, CircuitState, RedisConnection, RedisSkippedError
from tests.helpers.redis_fixtures import RedisServer

pytestmark = pytest.mark.slow

TIMEOUT = 0.1  # REDIS_TIMEOUT_SECONDS
STARVED = 0.5  # how long the event loop is kept from running: past every deadline of the calls in flight


def failures(client: str, reason: str) -> float:
    return metrics.REDIS_CALL_FAILURES.labels(client=client, reason=reason)._value.get()


async def starve() -> None:
    """Let every ready task take its step (send its command, start its wait), then keep the loop from running."""
    for _ in range(3):
        await asyncio.sleep(0)
    time.sleep(STARVED)  # blocking on purpose: nothing on this loop runs meanwhile


async def test_calls_timed_out_by_a_starved_event_loop_fail_alone_and_the_circuit_stays_closed(redis_url: str) -> None:
    redis = RedisConnection(redis_url, name="starved", timeout_seconds=TIMEOUT, max_connections=4)
    try:
        await asyncio.gather(*(redis.call(redis.client.ping) for _ in range(4)))  # the pool's 4 connections
        await redis.call(lambda: redis.client.set("starved", "1"))
        timeouts, busy = failures("starved", "timeout"), failures("starved", "pool_busy")

        calls = [asyncio.ensure_future(redis.call(lambda: redis.client.get("starved"))) for _ in range(12)]
        await starve()
        results = await asyncio.gather(*calls, return_exceptions=True)
        failed = [result for result in results if isinstance(result, BaseException)]
        print(f"\nstarved {STARVED} s: {len(failed)} of {len(calls)} failed: {sorted({repr(f) for f in failed})}")
        assert any(isinstance(result, TIMEOUTS) for result in failed)  # answers read after their deadline
        assert all(isinstance(result, REDIS_FAILURES) for result in failed)  # each user's fallback applies
        assert not any(isinstance(result, RedisSkippedError) for result in failed)
        assert failures("starved", "timeout") > timeouts
        assert failures("starved", "timeout") + failures("starved", "pool_busy") == timeouts + busy + len(failed)
        assert redis.circuit.state is CircuitState.CLOSED

        # The health PING the timeouts sent, and one starved in its turn: neither opens the circuit.
        assert redis._check is not None
        await asyncio.wait([redis._check])
        assert redis.circuit.state is CircuitState.CLOSED
        redis.known_up()  # another health PING, now
        await starve()
        await asyncio.wait([redis._check])
        assert redis.circuit.state is CircuitState.CLOSED
        assert metrics.REDIS_CIRCUIT_OPEN.labels(client="starved")._value.get() == 0

        assert await redis.call(lambda: redis.client.get("starved")) == b"1"  # the next call, at once
    finally:
        await redis.aclose()


async def test_a_frozen_redis_still_opens_the_circuit_and_a_probe_closes_it_after_sigcont(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    timeout = 0.25  # the default: the PING's verdict needs a loop late by less than half of it, on a busy host

    with caplog.at_level(logging.INFO, logger="gateway.redis_client"):
        redis = RedisConnection(own_redis.url, name="sigstop", timeout_seconds=timeout, backoff_seconds=0.2)
        try:
            assert await redis.call(redis.client.ping)
            own_redis.freeze()
            try:
                deadline = time.monotonic() + 20 * timeout
                while redis.circuit.closed:
                    assert time.monotonic() < deadline, "a frozen Redis did not open the circuit"
                    started = time.monotonic()
                    with pytest.raises(REDIS_FAILURES):
                        await redis.call(redis.client.ping)
                    assert time.monotonic() - started < 2 * timeout + 0.5  # one call's deadline at most
                    if redis._check is not None:
                        await asyncio.wait([redis._check])  # the health PING the timeout sent
                assert failures("sigstop", "timeout") >= 1
                with pytest.raises(RedisSkippedError):
                    await redis.call(redis.client.ping)  # every user skips it now, without waiting
            finally:
                own_redis.thaw()
            deadline = time.monotonic() + 5.0
            while not redis.circuit.closed:  # the probe after each window
                assert time.monotonic() < deadline, "the circuit did not close after SIGCONT"
                await asyncio.sleep(0.05)
            assert await redis.call(redis.client.ping)
        finally:
            await redis.aclose()
    logged = [record.getMessage() for record in caplog.records if record.levelno >= logging.INFO]
    assert sum("does not answer" in message for message in logged) == 1
    assert sum("answers again" in message for message in logged) == 1
