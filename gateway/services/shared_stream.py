"""One upstream stream, followed by every identical request that arrives while it runs (single flight)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing


class SharedStream:
    """Chunks of one producer, replayed from the start to each follower and then followed live.

    A follower gets batches: every chunk that arrived since its last batch. Under load several chunks
    come in between two turns of a follower, and one batch is one write to its client rather than one
    write (and one pass through the middleware stack) per chunk; nothing waits to fill a batch.
    The producer runs in its own task; it is cancelled (closing the upstream call) only when the
    last follower has gone. `on_done(self)` runs once, when the stream takes no more followers: when it
    ends, or at once when its last follower leaves (a request arriving then starts its own call rather
    than joining one that is being cancelled).
    """

    def __init__(self, source: AsyncGenerator[str, None], on_done: Callable[[SharedStream], object]) -> None:
        self._chunks: list[str] = []
        self._done = False
        self._error: BaseException | None = None
        self._changed = asyncio.Event()
        self._followers = 0
        self._on_done: Callable[[SharedStream], object] | None = on_done
        self._producer = asyncio.create_task(self._produce(source))

    def follow(self) -> AsyncGenerator[list[str], None]:
        """A follower, counted now rather than at its first step: between a request joining and its
        response starting, the last other follower may leave, and must not cancel the producer then.
        (A follower never iterated keeps the producer running to the end: the answer is still cached.)"""
        self._followers += 1
        return self._follow()

    async def _follow(self) -> AsyncGenerator[list[str], None]:
        index = 0
        try:
            while True:
                if index < len(self._chunks):
                    batch = self._chunks[index:]
                    index += len(batch)
                    yield batch
                    continue  # more may have come meanwhile
                if self._done:
                    if self._error is not None:
                        raise self._error
                    return
                changed = self._changed
                await changed.wait()
        finally:
            self._followers -= 1
            if self._followers == 0 and not self._done:
                self._finished()
                self._producer.cancel()

    async def _produce(self, source: AsyncGenerator[str, None]) -> None:
        try:
            async with aclosing(source):
                async for chunk in source:
                    self._chunks.append(chunk)
                    self._notify()
        except Exception as exc:  # handed to every follower
            self._error = exc
        finally:
            self._done = True
            self._notify()
            self._finished()

    def _finished(self) -> None:
        if self._on_done is not None:
            on_done, self._on_done = self._on_done, None
            on_done(self)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
