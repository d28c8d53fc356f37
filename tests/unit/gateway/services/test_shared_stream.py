"""SharedStream: followers get every chunk once, in batches of what arrived since their last batch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from gateway.services.shared_stream import SharedStream, StreamAbandonedError


class Source:
    """Chunks "c0".."c<n-1>", each released by `step()`; optionally fails after them."""

    def __init__(self, count: int, fail: bool = False) -> None:
        self.count = count
        self.fail = fail
        self.closed = False
        self._released = asyncio.Semaphore(0)

    def step(self, chunks: int = 1) -> None:
        for _ in range(chunks):
            self._released.release()

    async def chunks(self) -> AsyncGenerator[list[str], None]:
        try:
            for index in range(self.count):
                await self._released.acquire()
                yield [f"c{index}"]
            if self.fail:
                raise RuntimeError("upstream broke")
        finally:
            self.closed = True


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_live_chunks_come_one_batch_each_and_a_late_follower_gets_the_past_in_one() -> None:
    source = Source(4)
    done: list[bool] = []
    shared = SharedStream(source.chunks(), lambda stream: done.append(stream is shared))
    early = shared.follow()
    first = asyncio.ensure_future(anext(early))
    source.step()
    assert await first == ["c0"]
    source.step()
    assert await anext(early) == ["c1"]
    late = shared.follow()
    assert await anext(late) == ["c0", "c1"]  # the replay: one batch
    source.step(2)
    await settle()
    assert await anext(early) == ["c2", "c3"]  # both arrived before this follower's next turn
    assert await anext(late) == ["c2", "c3"]
    for follower in (early, late):
        with pytest.raises(StopAsyncIteration):
            await anext(follower)
    assert done == [True] and source.closed


async def test_an_upstream_error_reaches_every_follower_after_the_chunks_before_it() -> None:
    source = Source(2, fail=True)
    shared = SharedStream(source.chunks(), lambda stream: None)
    followers = [shared.follow(), shared.follow()]
    source.step(2)
    await settle()
    for follower in followers:
        assert await anext(follower) == ["c0", "c1"]
        with pytest.raises(RuntimeError, match="upstream broke"):
            await anext(follower)


async def test_the_source_is_closed_a_pause_after_the_last_follower_leaves_and_not_before() -> None:
    source = Source(10)
    shared = SharedStream(source.chunks(), lambda stream: None, abandon_after_seconds=0.05)
    first, second = shared.follow(), shared.follow()
    source.step()
    assert await anext(first) == ["c0"]
    assert await anext(second) == ["c0"]
    await first.aclose()
    await asyncio.sleep(0.1)
    assert not source.closed
    await second.aclose()
    await settle()
    assert not source.closed  # the pause: a request may have joined without reading yet
    await asyncio.sleep(0.1)
    assert source.closed


async def test_a_follower_that_joined_but_has_not_started_keeps_the_producer_running() -> None:
    """The window between a request joining a stream and its response starting to read: the last other
    follower leaving then must not cut the answer the joiner gets."""

    source = Source(3)
    shared = SharedStream(source.chunks(), lambda stream: None, abandon_after_seconds=0.2)
    leaving = shared.follow()
    source.step()
    assert await anext(leaving) == ["c0"]
    joined = shared.follow()  # not iterated yet
    await leaving.aclose()
    await asyncio.sleep(0.05)
    assert await anext(joined) == ["c0"]  # began to read within the pause
    await asyncio.sleep(0.3)
    assert not source.closed
    source.step(2)
    await settle()
    assert await anext(joined) == ["c1", "c2"]
    with pytest.raises(StopAsyncIteration):
        await anext(joined)


async def test_an_abandoned_stream_is_forgotten_once_and_a_late_follower_gets_an_error_not_a_cut_answer() -> None:
    source = Source(10)
    forgotten: list[SharedStream] = []
    shared = SharedStream(source.chunks(), forgotten.append, abandon_after_seconds=0.05)
    follower = shared.follow()
    source.step()
    assert await anext(follower) == ["c0"]
    late = shared.follow()  # joined, and begins to read only after the pause
    await follower.aclose()
    assert forgotten == []
    await asyncio.sleep(0.1)
    assert source.closed and forgotten == [shared]
    assert await anext(late) == ["c0"]
    with pytest.raises(StreamAbandonedError):
        await anext(late)
    assert forgotten == [shared]


async def test_requests_arriving_while_a_stream_opens_follow_it_or_get_its_error() -> None:
    from gateway.errors import UpstreamTimeoutError
    from gateway.services.shared_stream import SharedStreams

    streams = SharedStreams()
    opened = asyncio.Event()
    opens: list[str] = []

    async def open_failing() -> AsyncGenerator[list[str], None]:
        opens.append("failing")
        await opened.wait()
        raise UpstreamTimeoutError("no first chunk in time")

    async def open_working() -> AsyncGenerator[list[str], None]:
        opens.append("working")
        await opened.wait()
        source = Source(1)
        source.step()
        return source.chunks()

    first = asyncio.ensure_future(streams.follow("k", open_failing))
    await settle()
    waiter = asyncio.ensure_future(streams.follow("k", open_working))
    await settle()
    opened.set()
    for request in (first, waiter):  # the opener's status is the waiter's; the waiter opened nothing
        with pytest.raises(UpstreamTimeoutError):
            await request
    assert opens == ["failing"]

    opened.clear()
    leaving = asyncio.ensure_future(streams.follow("k", open_failing))
    await settle()
    follower = asyncio.ensure_future(streams.follow("k", open_working))
    await settle()
    leaving.cancel()  # the opening client went away: the waiter opens the stream itself
    await settle()
    opened.set()
    batches = [batch async for batch in await follower]
    assert batches == [["c0"]] and opens == ["failing", "failing", "working"]
