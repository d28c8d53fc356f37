"""`RateLeases` over a lease call of our own (the Redis script is tested in test_key_leases.py): which limits are
leased, a refused lease refuses without asking again until its wait is over, a failed one hands the request to
the exact check."""

from __future__ import annotations

import asyncio

from gateway.keys.checks import Check, Refusal
from gateway.keys.leases import MIN_LEASE, WINDOW_US, RateLeases, leasable
from gateway.redis_client import RedisSkippedError

BIG = Check("rate", "big", 10)  # 6,000,000 per minute
SMALL = Check("rate", "small", WINDOW_US // (MIN_LEASE - 1))


class Counter:
    def __init__(self, granted: int, wait_us: int = 0, fails: bool = False) -> None:
        self.granted, self.wait_us, self.fails = granted, wait_us, fails
        self.calls: list[int] = []

    async def __call__(self, check: Check, wanted: int) -> tuple[int, int]:
        self.calls.append(wanted)
        await asyncio.sleep(0)
        if self.fails:
            raise RedisSkippedError("circuit open")
        return min(wanted, self.granted), self.wait_us


def test_only_limits_whose_window_holds_enough_intervals_are_leased() -> None:
    assert leasable(BIG) and not leasable(SMALL)
    assert not leasable(Check("budget", "spent", 1.0, "cost", 1))


async def test_a_lease_serves_many_requests_with_few_calls() -> None:
    call = Counter(granted=1_000_000)
    leases = RateLeases(call)
    taken = []
    for _ in range(200):
        taken.append(await leases.take(BIG))
        await asyncio.sleep(0)  # a background renewal gets its turn
    await leases.aclose()
    assert all(t is True for t in taken)
    assert len(call.calls) < 20, call.calls


async def test_a_refused_lease_refuses_until_its_wait_is_over() -> None:
    call = Counter(granted=0, wait_us=5_000_000)
    leases = RateLeases(call)
    first, second = await leases.take(BIG), await leases.take(BIG)
    assert isinstance(first, Refusal) and isinstance(second, Refusal) and len(call.calls) == 1
    assert 4.9 < second.wait_seconds <= 5.0


async def test_a_failed_lease_leaves_the_request_to_the_exact_check() -> None:
    leases = RateLeases(Counter(granted=10, fails=True))
    assert await leases.take(BIG) is None
