"""The per-key and per-team limits (`Gatekeeper` over `RedisKeyLimiter` and `LocalKeyLimiter`): three
gatekeepers on one real Redis, as three replicas, keep a key's requests per minute (a burst of N, then one every
60/N s), chat tokens per minute, a team's concurrent chat streams and videos per day together; in process, one
limiter keeps the same rules."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gateway.errors import RateLimitExceededError
from gateway.keys import names
from gateway.keys.gatekeeper import Gatekeeper
from gateway.keys.limiter import Check, KeyLimiter, LocalKeyLimiter, RedisKeyLimiter
from gateway.keys.model import ApiKey
from gateway.keys.resolver import KeyResolver

SECRET = "sk-limits-test-key-0001"
TPM = 1200
ESTIMATE = 10
RPM = 6  # a burst of 6, then one every 10 s
INTERVAL_US = 500_000  # a rate check of its own: 5 at once, then one every 0.5 s
BURST = 5


@pytest.fixture(params=["redis", "local"])
def redis_or_not(request: pytest.FixtureRequest) -> str | None:
    """The Redis URL the three gatekeepers share, or None: one in-process limiter for the three."""
    return str(request.getfixturevalue("redis_url")) if request.param == "redis" else None


@asynccontextmanager
async def three_gatekeepers(redis_url: str | None, keys_file: Path, keys_yaml: str) -> AsyncIterator[list[Gatekeeper]]:
    keys_file.write_text(keys_yaml)
    resolver = KeyResolver([], keys_file=str(keys_file))
    await resolver.refresh()  # loaded once: nothing changes in these tests
    if redis_url is not None:
        limiters: list[KeyLimiter] = [RedisKeyLimiter(redis_url, timeout_seconds=2) for _ in range(3)]
    else:
        limiters = [LocalKeyLimiter()] * 3
    try:
        yield [Gatekeeper(resolver, limiter) for limiter in limiters]
    finally:
        for limiter in limiters:
            await limiter.aclose()


def the_key(gatekeeper: Gatekeeper) -> ApiKey:
    return gatekeeper.authenticate(f"Bearer {SECRET}", "chat")


async def test_chat_tokens_per_minute_hold_across_three(redis_or_not: str | None, tmp_path: Path) -> None:
    keys = f"keys:\n  - {{name: k, team: t, secret: {SECRET}, limits: {{chat_tokens_per_minute: {TPM}}}}}\n"
    async with three_gatekeepers(redis_or_not, tmp_path / "keys.yaml", keys) as keepers:
        key = the_key(keepers[0])
        admitted = 0
        started = time.monotonic()
        while time.monotonic() - started < 3.0:
            for keeper in keepers:
                try:
                    async with keeper.chat(key, ESTIMATE) as reservation:
                        reservation.settle(ESTIMATE)
                    admitted += 1
                except RateLimitExceededError as exc:
                    assert exc.code == "rate_limit_exceeded" and "chat tokens per minute" in exc.message
            await asyncio.sleep(0.005)
        elapsed = time.monotonic() - started
        allowed = (TPM + elapsed * TPM / 60) / ESTIMATE  # a full bucket, then its refill
        assert admitted <= allowed + 1
        assert admitted >= 0.95 * allowed, (admitted, allowed)


async def test_settling_gives_back_what_the_estimate_took_too_much(redis_or_not: str | None, tmp_path: Path) -> None:
    keys = f"keys:\n  - {{name: k, team: t, secret: {SECRET}, limits: {{chat_tokens_per_minute: 1000}}}}\n"
    async with three_gatekeepers(redis_or_not, tmp_path / "keys.yaml", keys) as keepers:
        key = the_key(keepers[0])
        for keeper in keepers * 3:  # nine calls that each reserve 900 and use 10: each gives 890 back
            async with keeper.chat(key, 900) as reservation:
                reservation.settle(10)
        # Without the give-backs the second call above would have been refused; now about 910 are left.
        async with keepers[0].chat(key, 800):
            with pytest.raises(RateLimitExceededError):
                async with keepers[1].chat(key, 800):
                    pass


async def test_a_teams_streams_and_videos_are_counted_together(redis_or_not: str | None, tmp_path: Path) -> None:
    keys = "teams:\n  t: {limits: {concurrent_chat_streams: 2, videos_per_day: 3}}\n"
    keys += f"keys:\n  - {{name: k, team: t, secret: {SECRET}}}\n"
    async with three_gatekeepers(redis_or_not, tmp_path / "keys.yaml", keys) as keepers:
        key = the_key(keepers[0])
        async with keepers[0].chat(key, 1), keepers[1].chat(key, 1):
            with pytest.raises(RateLimitExceededError, match="team 't' is over its limit of concurrent chat streams"):
                async with keepers[2].chat(key, 1):
                    pass
        async with keepers[2].chat(key, 1):  # both slots were given back
            pass
        for keeper in keepers:
            await keeper.count_video(key)
        with pytest.raises(RateLimitExceededError, match="videos per day") as refused:
            await keepers[0].count_video(key)
        assert int(refused.value.headers["Retry-After"]) >= 1


async def test_requests_per_minute_admit_n_back_to_back_across_three(redis_or_not: str | None, tmp_path: Path) -> None:
    keys = f"keys:\n  - {{name: k, team: t, secret: {SECRET}, limits: {{requests_per_minute: {RPM}}}}}\n"
    async with three_gatekeepers(redis_or_not, tmp_path / "keys.yaml", keys) as keepers:
        key = keepers[0].authenticate(f"Bearer {SECRET}", "models")
        for n in range(RPM):
            await keepers[n % len(keepers)].admit(key, "models")
        with pytest.raises(RateLimitExceededError, match="over its limit of requests per minute") as refused:
            await keepers[0].admit(key, "models")
        assert refused.value.headers["Retry-After"] == str(60 // RPM)  # the next one refills in 60/N s


async def test_a_rate_admits_its_burst_then_one_per_interval_across_two(redis_or_not: str | None) -> None:
    if redis_or_not is not None:
        limiters: list[KeyLimiter] = [RedisKeyLimiter(redis_or_not, timeout_seconds=2) for _ in range(2)]
    else:
        limiters = [LocalKeyLimiter()] * 2
    check = Check("rate", names.limit_key("rpm", names.key_subject("burst"), "models"), INTERVAL_US, BURST)
    interval = INTERVAL_US / 1e6
    try:
        started = time.monotonic()
        assert [await limiters[n % 2].admit([check]) for n in range(BURST)] == [None] * BURST
        refusal = await limiters[BURST % 2].admit([check])
        assert refusal is not None and refusal.check == check
        assert interval - (time.monotonic() - started) - 0.005 <= refusal.wait_seconds <= interval
        await asyncio.sleep(refusal.wait_seconds + 0.005)  # Redis' clock is not this process's
        assert await limiters[0].admit([check]) is None  # refilled: one more
        again = await limiters[1].admit([check])
        assert again is not None and interval / 2 <= again.wait_seconds <= interval
    finally:
        for limiter in limiters:
            await limiter.aclose()
