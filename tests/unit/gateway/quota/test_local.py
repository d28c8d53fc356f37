"""`LocalQuotaLimiter`: rate, concurrency and token limits; waiting, refusing without taking, releasing on every exit.

Each test runs on the real clock, with rates high enough that the whole module takes a few seconds.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY

from gateway.errors import OverloadedError
from gateway.quota import LocalQuotaLimiter, QuotaConfig, build_limiter
from tests.helpers.conditions import until


def make_limiter(**fields: Any) -> LocalQuotaLimiter:
    """A limiter whose rate is out of the way unless the test sets one (back-to-back calls are 1 ms apart)."""
    return LocalQuotaLimiter(QuotaConfig(**{"requests_per_second": 1000, **fields}), name="test")


def max_in_window(times: list[float], width: float = 1.0) -> int:
    """The most admissions in any closed window [t, t + width] (one starts at an admission at its fullest)."""
    micros = sorted(round(t * 1_000_000) for t in times)
    width_us, best, first = round(width * 1_000_000), 0, 0
    for last, end in enumerate(micros):
        while end - micros[first] > width_us:
            first += 1
        best = max(best, last - first + 1)
    return best


def quota_waits(reason: str) -> float:
    """How many times a caller of the limiters named "test" started waiting for `reason`."""
    return REGISTRY.get_sample_value("gateway_quota_waits_total", {"limiter": "test", "reason": reason}) or 0.0


async def admitted_at(limiter: LocalQuotaLimiter, estimated_tokens: int = 0) -> float:
    async with limiter.slot(estimated_tokens) as slot:
        return slot.admitted_at


async def hold(limiter: LocalQuotaLimiter, seconds: float, holding: asyncio.Event | None = None) -> None:
    """Hold a slot for `seconds`; `holding` is set once the slot is taken."""
    async with limiter.slot():
        if holding is not None:
            holding.set()
        await asyncio.sleep(seconds)


async def refusal(limiter: LocalQuotaLimiter, estimated_tokens: int = 0) -> OverloadedError:
    with pytest.raises(OverloadedError) as caught:
        await admitted_at(limiter, estimated_tokens)
    return caught.value


@pytest.mark.parametrize("margin", [0.0, 0.05])
async def test_rate_spreads_a_burst_so_no_second_and_margin_holds_more_than_the_rate(margin: float) -> None:
    config = QuotaConfig(requests_per_second=50, max_concurrent=100, max_wait_seconds=5, rate_margin_seconds=margin)
    limiter = LocalQuotaLimiter(config, name="test")
    times = sorted(await asyncio.gather(*(admitted_at(limiter) for _ in range(55))))
    assert min(later - earlier for earlier, later in itertools.pairwise(times)) >= config.interval_us / 1e6
    # At most 50 in any window of 1 s + margin; close to 50 in the busiest second (late wake-ups cost a few).
    assert max_in_window(times, 1 + margin) <= 50
    assert max_in_window(times) >= 45
    assert times[-1] - times[0] < 1.5  # 54 gaps of 0.02 to 0.021 s, plus late wake-ups


async def test_concurrency_never_exceeds_the_limit_and_a_release_wakes_the_next_waiter_at_once() -> None:
    in_block, most = 0, 0

    async def call(limiter: LocalQuotaLimiter) -> float:
        nonlocal in_block, most
        async with limiter.slot() as slot:
            in_block += 1
            most = max(most, in_block)
            await asyncio.sleep(0.05)
            in_block -= 1
            return slot.waited_seconds

    waits_before = quota_waits("concurrency")
    started = time.monotonic()
    limiter = make_limiter(requests_per_second=1000, max_concurrent=3, max_wait_seconds=5)
    waits = await asyncio.gather(*(call(limiter) for _ in range(12)))
    assert most == 3
    assert quota_waits("concurrency") - waits_before >= 3  # at least the head of each of the three later rounds
    assert time.monotonic() - started < 1  # four rounds of 0.05 s; without the wake-up the last would wait 5 s
    assert 0.15 <= max(waits) < 0.5


async def test_no_slot_within_the_wait_raises_overloaded_after_max_wait_and_takes_nothing() -> None:
    limiter = make_limiter(max_concurrent=1, max_wait_seconds=0.1)
    holding = asyncio.Event()
    holder = asyncio.create_task(hold(limiter, 0.2, holding))
    await holding.wait()
    started = time.monotonic()
    error = await refusal(limiter)
    waited = time.monotonic() - started
    await holder
    async with limiter.slot() as slot:
        next_wait = slot.waited_seconds
    assert error.status_code == 429
    assert error.headers == {"Retry-After": "1"}
    assert "all 1 concurrent calls busy" in error.message
    assert 0.1 <= waited < 0.3
    assert next_wait < 0.05


async def test_a_rate_wait_beyond_max_wait_fails_at_once_and_does_not_push_back_the_next_slot() -> None:
    limiter = make_limiter(requests_per_second=2, max_wait_seconds=0.1)
    await admitted_at(limiter)
    started = time.monotonic()
    error = await refusal(limiter)
    refused_after = time.monotonic() - started
    await asyncio.sleep(0.55)  # one interval: (1 s + 0.05 s margin) / 2
    async with limiter.slot() as slot:
        next_wait = slot.waited_seconds
    assert refused_after < 0.05
    assert error.headers == {"Retry-After": "1"}
    assert "2 requests/s in use" in error.message
    assert next_wait < 0.05


async def test_queued_callers_are_refused_when_their_own_wait_runs_out() -> None:
    limiter = make_limiter(max_concurrent=1, max_wait_seconds=0.1)
    holding = asyncio.Event()
    holder = asyncio.create_task(hold(limiter, 0.3, holding))
    await holding.wait()
    started = time.monotonic()
    outcomes = await asyncio.gather(*(admitted_at(limiter) for _ in range(5)), return_exceptions=True)
    elapsed = time.monotonic() - started
    await holder
    assert all(isinstance(outcome, OverloadedError) for outcome in outcomes)
    assert 0.1 <= elapsed < 0.25


async def test_tokens_are_taken_on_entry_and_a_refused_estimate_takes_none() -> None:
    limiter = make_limiter(tokens_per_minute=600, max_wait_seconds=0.5)  # 10 tokens per second
    await admitted_at(limiter, 500)
    error = await refusal(limiter, 200)  # 100 left: 100 more take 10 s
    async with limiter.slot(90) as slot:
        fitting_wait = slot.waited_seconds
    assert error.headers == {"Retry-After": "10"}
    assert "200 tokens needed, 600 tokens/minute in use" in error.message
    assert fitting_wait < 0.05


async def test_a_caller_waits_for_the_tokens_it_estimated() -> None:
    limiter = make_limiter(tokens_per_minute=6000, max_wait_seconds=1)  # 100 tokens per second
    await admitted_at(limiter, 6000)
    async with limiter.slot(20) as slot:
        assert 0.19 <= slot.waited_seconds < 0.4


async def test_settle_gives_back_an_overestimate_and_charges_an_underestimate() -> None:
    limiter = make_limiter(tokens_per_minute=600, max_wait_seconds=0.5)
    async with limiter.slot(500) as slot:
        slot.settle(100)
    async with limiter.slot(500) as slot:  # 400 were given back
        waited = slot.waited_seconds
        slot.settle(600)  # 100 more than reserved, with the budget used up: the balance goes to -100
    error = await refusal(limiter, 0)
    assert waited < 0.05
    assert error.headers == {"Retry-After": "10"}


async def test_an_estimate_above_one_minute_of_budget_takes_the_whole_budget() -> None:
    limiter = make_limiter(tokens_per_minute=600, max_wait_seconds=0.5)
    async with limiter.slot(10_000) as slot:
        reserved = slot.reserved_tokens
    error = await refusal(limiter, 10)
    assert reserved == 600
    assert "10 tokens needed" in error.message


async def test_the_slot_is_released_when_the_block_raises() -> None:
    limiter = make_limiter(max_concurrent=1, max_wait_seconds=0.05)
    with pytest.raises(RuntimeError, match="upstream broke"):
        async with limiter.slot():
            raise RuntimeError("upstream broke")
    async with limiter.slot() as slot:
        assert slot.waited_seconds < 0.05


async def test_the_slot_is_released_when_the_holder_or_a_waiter_is_cancelled() -> None:
    limiter = make_limiter(max_concurrent=1, max_wait_seconds=5)
    holding = asyncio.Event()
    holder = asyncio.create_task(hold(limiter, 10, holding))
    await holding.wait()
    waits = quota_waits("concurrency")
    waiter = asyncio.create_task(admitted_at(limiter))
    await until(lambda: quota_waits("concurrency") > waits, what="the waiter queued behind the holder")
    for task in (waiter, holder):
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    async with limiter.slot() as slot:
        assert slot.waited_seconds < 0.05


@pytest.mark.parametrize(
    "fields",
    [
        {"requests_per_second": 0},
        {"max_concurrent": 0},
        {"tokens_per_minute": 0},
        {"max_wait_seconds": -1},
        {"lease_seconds": 0},
        {"rate_margin_seconds": -0.01},
    ],
)
def test_config_rejects_values_that_could_never_admit_a_call(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        QuotaConfig(**fields)


async def test_negative_token_counts_are_rejected() -> None:
    limiter = make_limiter()
    with pytest.raises(ValueError, match="estimated_tokens"):
        await admitted_at(limiter, -1)
    async with limiter.slot() as slot:
        with pytest.raises(ValueError, match="actual_tokens"):
            slot.settle(-1)


async def test_build_limiter_without_redis_is_local() -> None:
    limiter = build_limiter(QuotaConfig(), None, name="hunyuan")
    assert isinstance(limiter, LocalQuotaLimiter)
    assert limiter.name == "hunyuan"
    await limiter.aclose()


async def test_pace_spaces_further_attempts_of_a_held_slot_by_the_rate_and_refuses_past_the_wait() -> None:
    config = QuotaConfig(requests_per_second=20, max_concurrent=1, max_wait_seconds=0.5, rate_margin_seconds=0)
    limiter = LocalQuotaLimiter(config, name="test")
    async with limiter.slot() as slot:
        times = [slot.admitted_at]
        for _ in range(3):
            await slot.pace()  # a retry inside the slot: one more arrival at the upstream
            times.append(time.monotonic())
    assert min(later - earlier for earlier, later in itertools.pairwise(times)) >= config.interval_us / 1e6 - 0.002

    slow = LocalQuotaLimiter(QuotaConfig(requests_per_second=1, max_wait_seconds=0.1), name="test")
    with pytest.raises(OverloadedError, match="requests/s in use"):
        async with slow.slot() as slot:
            await slot.pace()  # the next arrival is 1 s away, more than the 0.1 s a caller may wait


async def test_pace_does_not_queue_behind_a_caller_waiting_for_the_slot_it_holds() -> None:
    config = QuotaConfig(requests_per_second=1000, max_concurrent=1, max_wait_seconds=2)
    limiter = LocalQuotaLimiter(config, name="test")
    async with limiter.slot() as slot:
        waits = quota_waits("concurrency")
        waiter = asyncio.create_task(admitted_at(limiter))  # heads the queue, waiting for this slot
        await until(lambda: quota_waits("concurrency") > waits, what="the waiter queued for the slot")
        started = time.monotonic()
        await slot.pace()
        paced = time.monotonic() - started
    await waiter
    assert paced < 0.1  # not the waiter's 2 s
