"""`RedisCircuit` states and `RedisConnection.call` around them, on a fake clock and fake commands."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway import metrics
from gateway.redis_client import CircuitState, RedisCircuit, RedisConnection, RedisSkippedError, _LoopWatch
from tests.helpers.conditions import until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def circuit_open(name: str) -> float:
    return metrics.REDIS_CIRCUIT_OPEN.labels(client=name)._value.get()


def test_a_failure_opens_the_circuit_and_calls_are_skipped_until_it_closes() -> None:
    clock = Clock()
    circuit = RedisCircuit("unit-open", backoff_seconds=2.0, clock=clock)
    circuit.admit()
    circuit.failed(RedisTimeoutError("Timeout reading from socket"))
    assert circuit.state is CircuitState.OPEN
    assert circuit_open("unit-open") == 1
    clock.now += 1.5
    with pytest.raises(RedisSkippedError, match=r"backing off after a failure, 0\.50 s left"):
        circuit.admit()
    clock.now += 1.0
    assert circuit.probe_due
    with pytest.raises(RedisSkippedError):  # callers never probe, even after the window
        circuit.admit()


def test_after_the_window_one_probe_goes_while_calls_are_skipped() -> None:
    clock = Clock()
    circuit = RedisCircuit("unit-probe", backoff_seconds=1.0, clock=clock)
    circuit.failed(ConnectionRefusedError())
    with pytest.raises(RedisSkippedError, match=r"1\.00 s left"):
        circuit.admit_probe()  # not yet
    clock.now += 1.0
    circuit.admit_probe()
    assert circuit.state is CircuitState.PROBING and not circuit.probe_due
    with pytest.raises(RedisSkippedError, match="backing off after a failure, Redis is being probed"):
        circuit.admit_probe()
    with pytest.raises(RedisSkippedError, match="Redis is being probed"):
        circuit.admit()
    circuit.succeeded()
    assert circuit.closed
    assert circuit_open("unit-probe") == 0
    circuit.admit()
    circuit.admit_probe()  # a check while closed is an ordinary call


def test_a_failed_probe_opens_a_new_window() -> None:
    clock = Clock()
    circuit = RedisCircuit("unit-reprobe", backoff_seconds=1.0, clock=clock)
    circuit.failed(ConnectionRefusedError())
    clock.now += 1.0
    circuit.admit_probe()
    circuit.failed(RedisTimeoutError())
    assert circuit.state is CircuitState.OPEN
    with pytest.raises(RedisSkippedError, match=r"1\.00 s left"):
        circuit.admit_probe()
    clock.now += 1.0
    circuit.admit_probe()
    assert circuit.state is CircuitState.PROBING


def test_an_abandoned_probe_lets_the_next_probe_go_at_once() -> None:
    clock = Clock()
    circuit = RedisCircuit("unit-abandon", backoff_seconds=1.0, clock=clock)
    circuit.failed(ConnectionRefusedError())
    clock.now += 1.0
    circuit.admit_probe()
    circuit.abandoned()
    assert circuit.probe_due
    circuit.admit_probe()
    assert circuit.state is CircuitState.PROBING


def test_one_warning_per_outage_and_one_info_at_recovery(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    circuit = RedisCircuit("unit-log", backoff_seconds=1.0, clock=clock)
    with caplog.at_level(logging.DEBUG, logger="gateway.redis_client"):
        for _ in range(5):  # an outage: the first failure, then failed probes
            circuit.failed(RedisTimeoutError("Timeout reading from socket"))
            clock.now += 1.0
            circuit.admit_probe()
        circuit.succeeded()
        circuit.succeeded()
    levels = [(record.levelno, record.getMessage()) for record in caplog.records]
    assert [level for level, _ in levels] == [logging.WARNING, logging.INFO]
    assert "Redis (client unit-log) does not answer (TimeoutError: Timeout reading from socket)" in levels[0][1]
    assert levels[1][1] == "Redis (client unit-log) answers again; its users are back on it"


def test_backoff_must_be_positive() -> None:
    with pytest.raises(ValueError, match="backoff_seconds must be > 0, got 0"):
        RedisCircuit("unit-zero", backoff_seconds=0)


async def test_call_opens_on_an_outage_but_not_on_an_error_reply() -> None:
    clock = Clock()
    redis = RedisConnection("redis://127.0.0.1:1/0", name="unit-call", backoff_seconds=1.0, clock=clock)

    async def refused() -> None:
        raise ResponseError("NOSCRIPT No matching script")

    with pytest.raises(ResponseError):
        await redis.call(refused)
    assert redis.circuit.closed  # Redis answered
    with pytest.raises(RedisConnectionError):
        await redis.call(redis.client.ping)  # nothing listens on port 1
    assert redis.circuit.state is CircuitState.OPEN
    with pytest.raises(RedisSkippedError):
        await redis.call(redis.client.ping)
    await redis.aclose()


async def test_a_call_is_bounded_by_twice_the_timeout_fails_alone_and_sends_a_health_ping() -> None:
    redis = RedisConnection("redis://127.0.0.1:1/0", name="unit-deadline", timeout_seconds=0.05)
    timeouts = metrics.REDIS_CALL_FAILURES.labels(client="unit-deadline", reason="timeout")

    async def hangs() -> None:
        await asyncio.sleep(60)

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        await redis.call(hangs)
    assert loop.time() - started < 0.1 + 0.5  # 2 x timeout_seconds, with room for a busy host
    assert redis.circuit.closed  # no verdict on Redis: the process may have been too slow to read its answer
    assert timeouts._value.get() == 1
    # the health PING it sent was refused
    await until(lambda: redis.circuit.state is CircuitState.OPEN, what="the health PING refused")
    await redis.aclose()


@pytest.mark.slow  # waits out two call deadlines
async def test_a_health_ping_that_times_out_opens_the_circuit_unless_the_event_loop_stalled() -> None:
    # The default timeout: a verdict needs the loop late by less than half of it, which a busy host allows.
    redis = RedisConnection("redis://127.0.0.1:1/0", name="unit-stall", timeout_seconds=0.25)

    async def stalls_then_hangs() -> None:
        time.sleep(0.6)  # the process starved of CPU: nothing on the loop runs meanwhile
        await asyncio.sleep(60)

    async def hangs() -> None:
        await asyncio.sleep(60)

    for command, opens in ((stalls_then_hangs, False), (hangs, True)):
        watch = _LoopWatch()
        try:
            with pytest.raises(TimeoutError):
                await redis._guarded(command, watch)
        finally:
            watch.stop()
        assert watch.stalled_for() > 0.5 if not opens else watch.stalled_for() < 0.125
        assert redis.circuit.state is (CircuitState.OPEN if opens else CircuitState.CLOSED)
    await redis.aclose()


async def test_without_calls_the_connection_probes_once_per_window() -> None:
    redis = RedisConnection("redis://127.0.0.1:1/0", name="unit-timer", backoff_seconds=0.05)
    with pytest.raises(RedisConnectionError):
        await redis.call(redis.client.ping)
    failed_at = redis.circuit._retry_at
    await asyncio.sleep(0.3)  # a few windows, no calls: each one's probe was refused and opened the next
    assert redis.circuit.state is CircuitState.OPEN and redis.circuit._retry_at > failed_at + 0.1
    await redis.aclose()


async def test_a_skipped_call_after_the_window_starts_the_probe_in_the_background() -> None:
    clock = Clock()
    redis = RedisConnection("redis://127.0.0.1:1/0", name="unit-kick", clock=clock)
    redis.circuit.failed(ConnectionRefusedError())
    clock.now += 5.0
    with pytest.raises(RedisSkippedError):
        await redis.call(lambda: asyncio.sleep(60))  # skipped at once, never run
    await asyncio.sleep(0)
    assert redis.circuit.state is CircuitState.PROBING  # the background PING
    await until(lambda: redis.circuit.state is CircuitState.OPEN, what="the PING refused: a new window")
    await redis.aclose()


async def test_shared_connection_closes_with_its_last_user_and_known_up_never_waits() -> None:
    redis = RedisConnection("redis://127.0.0.1:1/0", name="unit-shared")
    user = RedisConnection.shared(redis)
    assert user is redis
    assert redis.known_up()  # nothing known against it yet; the check runs in the background
    await until(lambda: not redis.known_up(), what="the background PING refused")
    await user.aclose()
    assert redis.client.connection_pool is not None
    await redis.aclose()
