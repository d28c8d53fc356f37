"""Requests-per-minute limits admitted from leased tokens and budgets from a copy of the spend (`RedisKeyLimiter`
over a real Redis, three gatekeepers as three replicas): the three together admit the limit's burst of N, then its
rate, within their bound; most requests cost no Redis call, and a budget spent on one replica is refused by the
others."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.errors import InsufficientQuotaError, RateLimitExceededError
from gateway.keys import names
from gateway.keys.gatekeeper import Gatekeeper
from gateway.keys.leases import EXPIRY_SECONDS, WINDOW_US
from gateway.keys.limiter import RedisKeyLimiter
from gateway.keys.resolver import KeyResolver
from tests.helpers.conditions import until

SECRET = "sk-leases-test-key-0001"
RPM = 12_000  # 200 per second: a window holds 20 intervals, so the limit is leased
HELD = WINDOW_US * RPM // 60_000_000  # the most tokens one replica holds


@asynccontextmanager
async def three_gatekeepers(redis_url: str, keys_file: Path, keys_yaml: str) -> AsyncIterator[list[Gatekeeper]]:
    keys_file.write_text(keys_yaml)
    resolver = KeyResolver([], keys_file=str(keys_file))
    await resolver.refresh()
    limiters = [RedisKeyLimiter(redis_url, timeout_seconds=2) for _ in range(3)]
    try:
        yield [Gatekeeper(resolver, limiter) for limiter in limiters]
    finally:
        for limiter in limiters:
            await limiter.aclose()


async def script_calls(redis_url: str) -> int:
    client = aioredis.Redis.from_url(redis_url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def holds_a_copy_of_the_spend(keeper: Gatekeeper) -> bool:
    """Whether the replica's copy of the spend has been read (in the background, after its first budget check)."""
    return bool(keeper.limiter._spend._spent)  # type: ignore[attr-defined]


async def test_a_leased_rate_admits_its_burst_then_holds_its_rate_across_three(redis_url: str, tmp_path: Path) -> None:
    keys = f"keys:\n  - {{name: k, team: t, secret: {SECRET}, limits: {{requests_per_minute: {RPM}}}}}\n"
    async with three_gatekeepers(redis_url, tmp_path / "keys.yaml", keys) as keepers:
        key = keepers[0].authenticate(f"Bearer {SECRET}", "models")
        started, burst = time.monotonic(), 0
        while True:  # back to back, round the replicas, until Redis has no token left to lease
            try:
                await keepers[burst % len(keepers)].admit(key, "models")
            except RateLimitExceededError:
                break
            burst += 1
        drained = time.monotonic() - started
        # The burst, what refilled meanwhile; less what the other replicas still hold, leased but not yet used.
        assert RPM - (len(keepers) - 1) * HELD <= burst <= RPM + drained * RPM / 60 + 1, (burst, drained)
        admitted = 0

        async def caller(keeper: Gatekeeper, until: float) -> None:
            nonlocal admitted
            while time.monotonic() < until:
                try:
                    await keeper.admit(key, "models")
                    admitted += 1
                except RateLimitExceededError as exc:
                    assert exc.code == "rate_limit_exceeded" and "requests per minute" in exc.message
                await asyncio.sleep(0.001)  # each caller asks for more than the whole limit

        started = time.monotonic()
        await asyncio.gather(*(caller(keeper, started + 3.0) for keeper in keepers for _ in range(2)))
        elapsed = time.monotonic() - started
        per_second = RPM / 60
        # The burst is spent: Redis leases the rate (and the one token refilling); each replica may hold one
        # window's worth besides.
        allowed = (elapsed + len(keepers) * WINDOW_US / 1e6) * per_second + 1
        assert admitted <= allowed
        assert admitted >= 0.95 * elapsed * per_second, (admitted, elapsed * per_second)


async def test_under_a_large_limit_most_requests_make_no_redis_call(redis_url: str, tmp_path: Path) -> None:
    keys = f"keys:\n  - {{name: k, team: t, secret: {SECRET}, limits: {{requests_per_minute: 600000}}}}\n"
    keys += "teams:\n  t: {limits: {requests_per_minute: 600000, monthly_budget: 100}}\n"
    async with three_gatekeepers(redis_url, tmp_path / "keys.yaml", keys) as keepers:
        key = keepers[0].authenticate(f"Bearer {SECRET}", "embeddings")
        before = await script_calls(redis_url)
        requests = 0
        for _ in range(100):  # about 1,000 requests per second, spread over the three
            for keeper in keepers:
                await keeper.admit(key, "embeddings")  # the key's and team's rates, the team's budget
                requests += 1
            await asyncio.sleep(0.003)
        calls = await script_calls(redis_url) - before
        assert calls < requests / 5, (calls, requests)


async def test_a_budget_spent_on_one_replica_is_refused_by_the_others(redis_url: str, tmp_path: Path) -> None:
    keys = f"keys:\n  - {{name: k, team: t, secret: {SECRET}, limits: {{monthly_budget: 1.5}}}}\n"
    async with three_gatekeepers(redis_url, tmp_path / "keys.yaml", keys) as keepers:
        key = keepers[0].authenticate(f"Bearer {SECRET}", "embeddings")
        for keeper in keepers:
            await keeper.admit(key, "embeddings")
        await until(lambda: all(holds_a_copy_of_the_spend(k) for k in keepers), what="the copies of the spend read")
        for keeper in keepers:
            await keeper.admit(key, "embeddings")

        # Replica 0 stores a record that spends the budget (the usage record script adds to the same hash).
        spent = [names.spend_key(names.month_of(time.time()), names.key_subject(key.id))]
        client = aioredis.Redis.from_url(redis_url)
        try:
            await client.hincrbyfloat(spent[0], "cost", 2.0)
        finally:
            await client.aclose()
        await keepers[0].limiter.add_spend(spent, 2.0, 100)
        with pytest.raises(InsufficientQuotaError):
            await keepers[0].admit(key, "embeddings")  # its own record: at once

        deadline = time.monotonic() + EXPIRY_SECONDS + 1
        refused: set[int] = set()
        while len(refused) < 2:
            assert time.monotonic() < deadline, f"replicas {sorted({1, 2} - refused)} still admit a spent budget"
            for n in (1, 2):
                try:
                    await keepers[n].admit(key, "embeddings")
                except InsufficientQuotaError as exc:
                    assert exc.code == "insufficient_quota"
                    refused.add(n)
            await asyncio.sleep(0.02)
