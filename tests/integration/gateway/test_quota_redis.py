"""`RedisQuotaLimiter` against a real redis-server: the quota holds across OS processes, leases free the slots
of crashed holders, and a Redis outage falls back to limiting in process instead of failing requests.

Tests close their limiters; replicas are separate processes running `tests/helpers/quota_worker.py`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.errors import OverloadedError
from gateway.quota import QuotaConfig, RedisQuotaLimiter, build_limiter
from gateway.wiring.chat import CHAT_QUOTA_KEYS
from localtriton.ports import free_port
from tests.helpers.redis_fixtures import RedisServer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
NAME = "test"
SLOTS = "quota:{test}:slots"


def make_limiter(url: str, **fields: Any) -> RedisQuotaLimiter:
    """A limiter whose rate is out of the way unless the test sets one (back-to-back calls are 1 ms apart)."""
    config = QuotaConfig(**{"requests_per_second": 1000, **fields})
    return RedisQuotaLimiter(url, config, name=NAME, backoff_seconds=0.2)


def max_in_window(micros: list[int], width_us: int = 1_000_000) -> int:
    """The most admissions in any closed window [t, t + width] (one starts at an admission at its fullest)."""
    micros, best, first = sorted(micros), 0, 0
    for last, end in enumerate(micros):
        while end - micros[first] > width_us:
            first += 1
        best = max(best, last - first + 1)
    return best


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one instant (an exit at the same instant as an entry closes first)."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    open_now, best = 0, 0
    for _, change in events:
        open_now += change
        best = max(best, open_now)
    return best


def held(server: RedisServer) -> int:
    return int(server.command("ZCARD", SLOTS).lstrip(b":"))


class SwallowingProxy:
    """A TCP proxy in front of redis-server that can swallow what clients send: a network blip in which a
    command is lost and its reply never comes."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.swallowing = False

    async def __aenter__(self) -> SwallowingProxy:
        self._listener = await asyncio.start_server(self._connect, "127.0.0.1", 0)
        self.url = f"redis://127.0.0.1:{self._listener.sockets[0].getsockname()[1]}/0"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._listener.close()

    async def _connect(self, client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        upstream, to_upstream = await asyncio.open_connection("127.0.0.1", self.server.port)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, swallowable: bool) -> None:
            try:
                while data := await source.read(65536):
                    if not (swallowable and self.swallowing):
                        sink.write(data)
                        await sink.drain()
            finally:
                sink.close()

        await asyncio.gather(pipe(client, to_upstream, True), pipe(upstream, to_client, False), return_exceptions=True)


async def refusal(limiter: RedisQuotaLimiter, estimated_tokens: int = 0) -> OverloadedError:
    with pytest.raises(OverloadedError) as caught:
        async with limiter.slot(estimated_tokens):
            pass
    return caught.value


async def hold(limiter: RedisQuotaLimiter, seconds: float, holding: asyncio.Event | None = None) -> None:
    """Hold a slot for `seconds`; `holding` is set once the slot is taken."""
    async with limiter.slot():
        if holding is not None:
            holding.set()
        await asyncio.sleep(seconds)


def worker(mode: str, url: str, *options: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.helpers.quota_worker", mode, url, "--name", NAME, *options]
    return subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


@contextmanager
def workers(count: int, mode: str, url: str, *options: str) -> Iterator[list[subprocess.Popen[str]]]:
    """Worker processes, killed and reaped on the way out whatever happened."""
    with ExitStack() as stack:
        processes = [stack.enter_context(worker(mode, url, *options)) for _ in range(count)]
        for process in processes:
            stack.callback(process.kill)
        yield processes


def expect_line(process: subprocess.Popen[str], expected: str) -> None:
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    assert line == expected, f"worker said {line!r} (exit code {process.poll()})"


def test_three_processes_together_keep_the_rate_and_the_concurrency(redis_url: str) -> None:
    rps, concurrency, per_process = 50, 5, 100
    options = ["--rps", str(rps), "--concurrency", str(concurrency), "--count", str(per_process)]
    with workers(3, "burst", redis_url, *options) as processes:
        for process in processes:
            expect_line(process, "ready")
        started = time.monotonic()
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        results = [json.loads(process.communicate(timeout=60)[0]) for process in processes]
    elapsed = time.monotonic() - started

    calls = [call for result in results for call in result["calls"]]
    assert [result["refused"] for result in results] == [0, 0, 0]
    assert len(calls) == 3 * per_process and all(call["shared"] for call in calls)
    admitted = sorted(round(call["admitted_at"] * 1_000_000) for call in calls)  # Redis TIME, microseconds
    config = QuotaConfig(requests_per_second=rps)  # the workers' rate and default margin
    assert min(b - a for a, b in itertools.pairwise(admitted)) >= config.interval_us
    assert max_in_window(admitted, round((1 + config.rate_margin_seconds) * 1_000_000)) <= rps
    assert max_in_window(admitted) >= 40  # the rate was what bound
    assert max_overlap([tuple(call["span"]) for call in calls]) <= concurrency
    assert elapsed < 15  # 6 s at the full rate; no caller starves


async def test_admissions_are_spaced_on_redis_time(redis_url: str) -> None:
    async with make_limiter(redis_url, requests_per_second=50, max_concurrent=100, rate_margin_seconds=0) as limiter:

        async def admitted_at() -> float:
            async with limiter.slot() as slot:
                return slot.admitted_at

        times = await asyncio.gather(*(admitted_at() for _ in range(20)))
    admitted = sorted(round(t * 1_000_000) for t in times)
    assert min(b - a for a, b in itertools.pairwise(admitted)) > 20_000


async def test_a_retry_is_paced_by_the_rate_all_replicas_share(redis_url: str) -> None:
    fields = {"requests_per_second": 10, "max_concurrent": 10, "rate_margin_seconds": 0, "max_wait_seconds": 2}
    async with (
        make_limiter(redis_url, **fields) as one,
        make_limiter(redis_url, **fields) as other,
        other.slot() as slot,
    ):
        await asyncio.sleep(0.15)  # past the next admission time its own call set
        async with one.slot():  # another replica's call sets it again, 100 ms ahead
            pass
        started = time.monotonic()
        await slot.pace()  # this replica's retry: one more arrival, after the other replica's call
        paced = time.monotonic() - started
    assert paced >= 0.09


async def test_no_slot_within_the_wait_raises_overloaded_and_takes_nothing(
    redis_url: str, redis_server: RedisServer
) -> None:
    async with make_limiter(redis_url, max_concurrent=1, max_wait_seconds=0.2) as limiter:
        holding = asyncio.Event()
        holder = asyncio.create_task(hold(limiter, 0.4, holding))
        await holding.wait()
        started = time.monotonic()
        error = await refusal(limiter)
        waited, held_during = time.monotonic() - started, held(redis_server)
        await holder
        async with limiter.slot() as slot:
            next_wait = slot.waited_seconds
    assert error.status_code == 429 and error.headers == {"Retry-After": "1"}
    assert 0.2 <= waited < 0.4
    assert held_during == 1
    assert next_wait < 0.1
    assert held(redis_server) == 0


async def test_a_rate_wait_beyond_max_wait_fails_at_once(redis_url: str) -> None:
    limiter = make_limiter(redis_url, requests_per_second=0.5, max_wait_seconds=0.5, rate_margin_seconds=0)
    async with limiter:
        async with limiter.slot():
            pass
        started = time.monotonic()
        error = await refusal(limiter)
        refused_after = time.monotonic() - started
    assert refused_after < 0.1
    assert error.headers == {"Retry-After": "2"}


async def test_tokens_are_taken_on_entry_and_settled_on_exit(redis_url: str) -> None:
    async with make_limiter(redis_url, tokens_per_minute=600, max_wait_seconds=0.5) as limiter:
        async with limiter.slot(500) as slot:
            slot.settle(100)  # 400 given back
        too_many = await refusal(limiter, 600)  # 500 left: 100 more take 10 s
        async with limiter.slot(500) as slot:
            waited = slot.waited_seconds
            slot.settle(600)  # 100 more than reserved, with the budget used up: the balance goes to -100
        in_debt = await refusal(limiter, 0)
    assert too_many.headers == {"Retry-After": "10"}
    assert "600 tokens needed" in too_many.message
    assert waited < 0.1
    assert in_debt.headers == {"Retry-After": "10"}


async def test_a_release_run_twice_corrects_the_tokens_once(redis_url: str) -> None:
    """redis-py runs a script again when its reply was lost (a timeout or a reset after it ran)."""
    async with make_limiter(redis_url, tokens_per_minute=600, max_wait_seconds=0.5) as limiter:
        async with limiter.slot(500) as slot:
            slot.settle(500)  # 100 left
        for _ in range(2):  # the same release, as a retry would send it: 400 given back, once
            await limiter._give_back("lease-retried", -400, only_if_held=False)
        error = await refusal(limiter, 600)  # 500 there: 100 short
    assert error.headers == {"Retry-After": "10"}


async def test_the_slot_is_released_when_the_block_raises_or_is_cancelled(
    redis_url: str, redis_server: RedisServer
) -> None:
    async with make_limiter(redis_url, max_concurrent=1, max_wait_seconds=0.5) as limiter:
        with pytest.raises(RuntimeError, match="upstream broke"):
            async with limiter.slot():
                raise RuntimeError("upstream broke")
        taken = asyncio.Event()
        holder = asyncio.create_task(hold(limiter, 10, taken))
        await taken.wait()
        holding = held(redis_server)
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder
        async with limiter.slot():
            pass
    assert holding == 1
    assert held(redis_server) == 0


async def test_a_release_lost_in_a_network_blip_is_tried_again_and_frees_the_slot(redis_server: RedisServer) -> None:
    async with SwallowingProxy(redis_server) as proxy, make_limiter(proxy.url, max_concurrent=1) as limiter:
        async with limiter.slot() as slot:
            assert slot.shared
            proxy.swallowing = True  # the release on leaving the block is lost
        during = held(redis_server)
        proxy.swallowing = False
        started = time.monotonic()
        while held(redis_server) and time.monotonic() - started < 5:
            await asyncio.sleep(0.05)
        after, seconds = held(redis_server), time.monotonic() - started
    assert (during, after) == (1, 0) and seconds < 2  # tried again after the 0.2 s back-off, not the 120 s lease


async def test_a_crashed_holders_slot_frees_itself_after_the_lease(redis_url: str) -> None:
    with workers(1, "hold", redis_url, "--concurrency", "1", "--lease", "1") as (process,):
        expect_line(process, "held")
        process.kill()
        process.wait(timeout=10)
    killed_at = time.monotonic()
    async with make_limiter(redis_url, max_concurrent=1, max_wait_seconds=0, lease_seconds=1) as busy:
        error = await refusal(busy)
    patient = make_limiter(redis_url, max_concurrent=1, max_wait_seconds=3, lease_seconds=1)
    async with patient, patient.slot():
        freed_after = time.monotonic() - killed_at
    assert "all 1 concurrent calls busy" in error.message
    assert freed_after < 1.5  # at most one lease after the last renewal


async def test_a_live_holder_keeps_its_slot_beyond_the_lease(redis_url: str) -> None:
    async with (
        make_limiter(redis_url, max_concurrent=1, lease_seconds=0.6) as owner,
        make_limiter(redis_url, max_concurrent=1, max_wait_seconds=0, lease_seconds=0.6) as other,
    ):
        holder = asyncio.create_task(hold(owner, 1.5))
        await asyncio.sleep(1.2)  # twice the lease: how long the slot outlives it is what is tested
        error = await refusal(other)
        await holder
    assert "concurrent calls busy" in error.message


async def test_redis_down_falls_back_to_local_limiting_logged_once(
    redis_url: str, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="gateway"):
        async with make_limiter(redis_url, max_concurrent=1, max_wait_seconds=0.05) as limiter:
            shared = [await slot_is_shared(limiter)]
            redis_server.stop()
            shared += [await slot_is_shared(limiter) for _ in range(3)]
            async with limiter.slot():
                busy = await refusal(limiter)  # the local fallback enforces the same limits
            redis_server.start()
            await asyncio.sleep(0.25)  # past the back-off
            shared_again = await slot_is_shared(limiter)
    assert shared == [True, False, False, False]
    assert "all 1 concurrent calls busy" in busy.message
    assert shared_again
    logged = [(record.levelno, record.getMessage()) for record in caplog.records]  # by the Redis circuit, once
    assert [level for level, message in logged if "does not answer" in message] == [logging.WARNING]
    assert [level for level, message in logged if "answers again" in message] == [logging.INFO]


async def test_an_unreachable_redis_never_fails_requests() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    async with make_limiter(url) as limiter:
        assert await slot_is_shared(limiter) is False


async def test_build_limiter_shares_the_quota_under_the_names_hash_tag(
    redis_url: str, redis_server: RedisServer
) -> None:
    """The chat quota keeps its Redis keys of 0.1 (`quota:{hunyuan}:*`): during a rolling upgrade the replicas of
    both releases hold the account's slots in one place."""
    limiter = build_limiter(QuotaConfig(), redis_url, name="chat", key_name=CHAT_QUOTA_KEYS)
    try:
        async with limiter.slot():
            exists = redis_server.command("EXISTS", "quota:{hunyuan}:slots")
    finally:
        await limiter.aclose()
    assert exists == b":1"


async def slot_is_shared(limiter: RedisQuotaLimiter) -> bool:
    async with limiter.slot() as slot:
        return slot.shared
