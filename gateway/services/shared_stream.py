"""One upstream stream, followed by every identical request that arrives while it opens or runs (single flight)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from functools import partial

from gateway.errors import GatewayError, UpstreamUnavailableError

ABANDON_AFTER_SECONDS = 0.5  # with no follower this long, the producer is cancelled


class StreamAbandonedError(UpstreamUnavailableError):
    """A chat request joined an identical stream in flight, which was cancelled (every client had left) before
    this follower began to read it.

    Do: retry: the request starts a call of its own.
    """

    code = "stream_abandoned"


class SharedStream:
    """Chunks of one producer (given in batches), replayed from the start to each follower and then followed live.

    A follower gets batches: every chunk that arrived since its last batch. Under load several chunks
    come in between two turns of a follower, and one batch is one write to its client rather than one
    write (and one pass through the middleware stack) per chunk; nothing waits to fill a batch.
    The producer runs in its own task. When the last follower has gone and none has come for
    `abandon_after_seconds`, it is cancelled (closing the upstream call) and `on_done(self)` runs, so a
    request arriving then starts a call of its own. The pause covers a request that has joined but
    whose response has not begun to read; one that begins only after the cancel gets
    `StreamAbandonedError`, never a cut answer that looks complete. `on_done` runs once: then, or when
    the stream ends.
    """

    def __init__(
        self,
        source: AsyncGenerator[list[str], None],
        on_done: Callable[[SharedStream], object],
        *,
        first: list[str] | None = None,
        abandon_after_seconds: float = ABANDON_AFTER_SECONDS,
    ) -> None:
        # `first`: a batch already taken from `source`, which a follower gets without waiting for the producer.
        self._chunks: list[str] = list(first) if first else []
        self._done = False
        self._abandoned = False
        self._error: BaseException | None = None
        # Followers waiting for the next chunk, each on a future of its own (an asyncio.Event per chunk would
        # look up the running loop, a system call, on every wait).
        self._waiters: list[asyncio.Future[None]] = []
        self._loop = asyncio.get_running_loop()
        self._followers = 0
        self._abandon_after = abandon_after_seconds
        self._abandoning: asyncio.TimerHandle | None = None
        self._on_done: Callable[[SharedStream], object] | None = on_done
        self._producer = asyncio.create_task(self._produce(source))

    async def follow(self) -> AsyncGenerator[list[str], None]:
        self._followers += 1
        if self._abandoning is not None:
            self._abandoning.cancel()
            self._abandoning = None
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
                    if self._abandoned:
                        raise StreamAbandonedError("the upstream stream was cancelled when its clients left; retry")
                    return
                waiter = self._loop.create_future()  # a follower that is cancelled cancels only its own
                self._waiters.append(waiter)
                await waiter
        finally:
            self._followers -= 1
            if self._followers == 0 and not self._done:
                self._abandoning = self._loop.call_later(self._abandon_after, self._abandon)

    def _abandon(self) -> None:
        self._abandoning = None
        if not self._done:
            self._abandoned = True
            self._finished()
            self._producer.cancel()

    async def _produce(self, source: AsyncGenerator[list[str], None]) -> None:
        try:
            async with aclosing(source):
                async for batch in source:
                    self._chunks += batch
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
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class _Opening:
    """A stream being opened: identical requests wait for the outcome."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.error: GatewayError | None = None
        self.stream: SharedStream | None = None  # given to the waiters even if it has ended before they wake


class SharedStreams:
    """The shared streams of the requests being answered, by request key.

    A stream counts as open once its first chunk has arrived (the response headers wait for it). An identical
    request that arrives while it opens waits too, then follows it, or gets the same error: the opening
    request's status (429, 502, 503, 504) is every waiter's. If the opening request goes away before, the next
    waiter opens the stream itself.
    """

    def __init__(self) -> None:
        self._running: dict[str, SharedStream] = {}
        self._opening: dict[str, _Opening] = {}

    async def follow(
        self, key: str, open_stream: Callable[[], Awaitable[AsyncGenerator[list[str], None]]]
    ) -> AsyncGenerator[list[str], None]:
        """Batches of the stream of `key`: the running one, else the one being opened, else a new one from
        `open_stream` (which returns once the first chunk is there, or raises)."""
        while (running := self._running.get(key)) is None and (opening := self._opening.get(key)) is not None:
            await opening.done.wait()
            if opening.error is not None:
                raise opening.error
            running = opening.stream
            if running is not None:
                break
        if running is not None:
            return running.follow()
        opening = self._opening[key] = _Opening()
        try:
            source = await open_stream()
            first = await _first_batch(source)
            shared = opening.stream = SharedStream(source, partial(self._forget, key), first=first)
            self._running[key] = shared
        except GatewayError as exc:
            opening.error = exc
            raise
        finally:
            del self._opening[key]
            opening.done.set()
        return shared.follow()

    def _forget(self, key: str, shared: SharedStream) -> None:
        if self._running.get(key) is shared:  # a newer stream of the same request may have taken the key
            del self._running[key]


async def _first_batch(source: AsyncGenerator[list[str], None]) -> list[str] | None:
    """The source's first batch, taken in the opening request's task: the source has it at hand once it has
    opened, and the first follower then writes it without waiting a loop turn for the producer task to start.
    A source that fails or is left here is closed."""
    try:
        return await anext(source, None)
    except BaseException:
        await source.aclose()
        raise
