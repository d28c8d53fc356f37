"""`LocalKeyLimiter`'s requests-per-minute check on a clock of the test's own (the same GCRA as `lua/admit.lua`,
tested over Redis in test_key_limits.py): a limit of N admits N back to back, refuses the next with the wait until
it would pass, admits one more every 60/N s, and refills to N, never more, while idle."""

from __future__ import annotations

from gateway.keys.checks import Check, Refusal
from gateway.keys.limiter import LocalKeyLimiter

RPM = 5
RATE = Check("rate", "rpm:key", 60_000_000 // RPM, RPM)  # 5 at once, then one every 12 s


class Clock:
    """Monotonic microseconds that move only when the test says."""

    def __init__(self) -> None:
        self.us = 1_000_000_000

    def __call__(self) -> int:
        return self.us

    def advance(self, seconds: float) -> None:
        self.us += round(seconds * 1_000_000)


async def take(limiter: LocalKeyLimiter, check: Check, times: int) -> list[Refusal | None]:
    return [await limiter.admit([check]) for _ in range(times)]


async def test_n_back_to_back_then_the_next_waits_60_over_n_seconds() -> None:
    clock = Clock()
    limiter = LocalKeyLimiter(clock)
    assert await take(limiter, RATE, RPM + 1) == [None] * RPM + [Refusal(RATE, 12.0)]
    clock.advance(11.999)
    assert await limiter.admit([RATE]) == Refusal(RATE, 0.001)  # the wait is the time left, not a full interval
    clock.advance(0.001)
    assert await take(limiter, RATE, 2) == [None, Refusal(RATE, 12.0)]  # one more, then the next interval


async def test_idle_time_refills_the_burst_up_to_n() -> None:
    clock = Clock()
    limiter = LocalKeyLimiter(clock)
    await take(limiter, RATE, RPM)
    clock.advance(24)  # two intervals: two requests
    assert await take(limiter, RATE, 3) == [None, None, Refusal(RATE, 12.0)]
    clock.advance(600)  # ten minutes idle: still N, not more
    assert await take(limiter, RATE, RPM + 1) == [None] * RPM + [Refusal(RATE, 12.0)]


async def test_a_refused_request_takes_nothing_from_the_rate() -> None:
    clock = Clock()
    limiter = LocalKeyLimiter(clock)
    full = Check("count", "videos", 0, 1, 1000)  # a limit already reached: the request is refused
    assert await limiter.admit([RATE, full]) == Refusal(full, 1.0)
    assert await take(limiter, RATE, RPM + 1) == [None] * RPM + [Refusal(RATE, 12.0)]


async def test_a_rate_check_without_a_burst_spaces_requests_evenly() -> None:
    clock = Clock()
    limiter = LocalKeyLimiter(clock)
    even = Check("rate", "even", 12_000_000)
    assert await take(limiter, even, 2) == [None, Refusal(even, 12.0)]
    clock.advance(12)
    assert await take(limiter, even, 2) == [None, Refusal(even, 12.0)]
