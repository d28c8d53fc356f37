"""CircuitBreaker on a hand-driven clock: open, half-open probe, and probes that end without a verdict."""

from __future__ import annotations

from gateway.upstreams.breaker import BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def opened(clock: Clock) -> CircuitBreaker:
    breaker = CircuitBreaker("m", failures=2, reset_seconds=10.0, clock=clock)
    breaker.record_failure()
    assert breaker.allow()  # one failure: still closed
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN and not breaker.allow()
    return breaker


def test_after_the_reset_time_one_probe_goes_through_and_its_verdict_decides() -> None:
    clock = Clock()
    breaker = opened(clock)
    clock.now += 10.0
    assert breaker.allow() and not breaker.allow()  # one probe at a time
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN and not breaker.allow()
    clock.now += 10.0
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED and breaker.allow() and breaker.allow()


def test_a_released_probe_lets_the_next_call_probe() -> None:
    clock = Clock()
    breaker = opened(clock)
    clock.now += 10.0
    assert breaker.allow()
    breaker.release()  # e.g. our quota refused the call: nothing learnt about the upstream
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow() and not breaker.allow()


def test_a_probe_never_answered_expires_after_the_reset_time() -> None:
    clock = Clock()
    breaker = opened(clock)
    clock.now += 10.0
    assert breaker.allow()
    clock.now += 9.9
    assert not breaker.allow()
    clock.now += 0.1
    assert breaker.allow() and not breaker.allow()


def test_release_on_a_closed_breaker_changes_nothing() -> None:
    breaker = CircuitBreaker("m", failures=1, reset_seconds=1.0, clock=Clock())
    breaker.release()
    assert breaker.state is BreakerState.CLOSED and breaker.allow()
