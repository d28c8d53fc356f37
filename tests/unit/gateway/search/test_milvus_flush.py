"""When the Milvus store flushes a collection: once a bulk write of enough rows goes quiet, never for small writes,
never twice for one burst; the flush against Milvus itself is tested in tests/integration/search."""

from __future__ import annotations

import asyncio

from gateway.search.milvus_flush import QuietFlush


async def test_a_burst_of_enough_rows_is_flushed_once_after_it_goes_quiet_and_small_writes_never() -> None:
    flushed: list[str] = []

    async def flush(target: str) -> None:
        flushed.append(target)

    flushes = QuietFlush(flush, min_rows=100, quiet_seconds=0.1)
    for _ in range(6):  # 120 rows, each write within the quiet time of the one before
        flushes.wrote("bulk", 20)
        flushes.wrote("small", 1)
        await asyncio.sleep(0.03)
    assert flushed == []  # still writing
    await flushes.settled()
    assert flushed == ["bulk"]
    flushes.wrote("bulk", 99)  # counted from the last flush: below the threshold again
    flushes.wrote("gone", 500)
    flushes.forget("gone")  # a deleted collection
    await asyncio.sleep(0.2)
    await flushes.aclose()
    assert flushed == ["bulk"]


async def test_a_failed_flush_is_logged_and_the_next_burst_flushes_again() -> None:
    calls = 0

    async def flush(target: str) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("Milvus is down")

    flushes = QuietFlush(flush, min_rows=10, quiet_seconds=0.05)
    flushes.wrote("c", 10)
    await flushes.settled()
    flushes.wrote("c", 10)
    await flushes.settled()
    await flushes.aclose()
    assert calls == 2


async def test_flushing_can_be_turned_off() -> None:
    async def flush(target: str) -> None:
        raise AssertionError("no flush with min_rows=0")

    flushes = QuietFlush(flush, min_rows=0, quiet_seconds=0.01)
    flushes.wrote("c", 10_000)
    await asyncio.sleep(0.05)
    await flushes.aclose()
