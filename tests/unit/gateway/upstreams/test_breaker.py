"""CircuitBreaker on a hand-driven clock: open, half-open probe, and probes that end without a verdict."""

from __future__ import annotations

from gateway.upstreams.breaker import BreakerBoard, BreakerState, CircuitBreaker


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


def test_the_board_keeps_the_most_recently_used_models_only() -> None:
    board = BreakerBoard(failures=1, reset_seconds=10.0, clock=Clock(), max_models=2)
    failing = board["a"]
    failing.record_failure()
    board["b"]
    assert board["a"] is failing and not board["a"].allow()  # used again: kept, still open
    for name in ("c", "d", "e"):  # a client naming model after model
        board[name]
    assert len(board) == 2
    assert board["a"] is not failing and board["a"].allow()  # dropped, then made anew
