"""Merge concurrent embedding calls into fewer, larger Triton calls.

Triton has a cost per request on top of the model (gRPC, the ensemble's scheduling, two
python-backend steps), so 32 single-text requests cost far more as 32 calls than as one.
`CoalescingEmbedder` sends a call at once while fewer than `max_in_flight` are running, so a quiet
gateway adds no delay; when all are busy, the texts that arrive wait for the next free slot and go
together, up to the model's max batch size per call (or `max_texts`). Under load the batches grow by
themselves, with no timer.

One call more may go while every slot is busy (an overlapping call): it is tokenized and queued in
Triton while the call before it runs, so the encoder starts on it without waiting for a round trip
through the gateway. It goes (`overlap_from`) as soon as as many texts wait as the running call
carries: calls then take turns at an even size (it takes at most half of what it and the running call
hold together, or twice the running call if that is more, `_call_limit`), and the new one has the running
call's whole encoding to cover its trip and tokenization. With fewer waiting, it goes when what is left of
the running call is one text's encoding, in the encoder's time per text (`EncoderPace`, an EWMA of the
calls' service times), so that texts still arriving join it. That estimate alone sent it too late under load: it
spreads each call's trip over the call's texts, so it overstates what is left of the running call
(the more, the smaller the calls), and calls settled into a large and a small one taking turns while
the encoder waited for each. A fixed count of waiting texts instead suited one machine and one load:
it never goes at low concurrency, leaving the round trip unhidden.

The queue is bounded by time: texts that would wait behind more than `max_queue_seconds` of encoding (what is left
of the running calls and the texts already waiting, at the encoder's pace) are refused at once with 429
`overloaded` and Retry-After, as the gateway's in-flight limit refuses requests: under overload a queue without
bound only turns every request into a timeout. A call that would go at once is never refused.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gateway import metrics
from gateway.errors import InvalidRequestError, OverloadedError
from gateway.services.embeddings import Embedder
from gateway.upstreams.triton import ModelInfo, TritonEmbeddings

PACE_WEIGHT = 0.2  # weight of the newest call in the EWMA: a few calls follow a change of load or machine


class EncoderPace:
    """The encoder's time per text, an EWMA over the calls' service times. A call that was sent while
    another ran waits in Triton until that one ends: its service starts then, not when it was sent."""

    def __init__(self, weight: float = PACE_WEIGHT) -> None:
        if not 0 < weight <= 1:
            raise ValueError("weight must be in (0, 1]")
        self.weight = weight
        self.seconds_per_text: float | None = None  # None until a call has ended
        self.last_end = -math.inf  # when the latest call ended

    def served_from(self, sent: float) -> float:
        """When the encoder began (or will begin) on a call sent at `sent`: then, or when the call before it ended."""
        return max(sent, self.last_end)

    def observe(self, texts: int, started: float, ended: float) -> None:
        service = ended - self.served_from(started)
        self.last_end = max(self.last_end, ended)
        if texts < 1 or service <= 0:
            return
        sample = service / texts
        previous = self.seconds_per_text
        self.seconds_per_text = sample if previous is None else previous + self.weight * (sample - previous)


def overlap_from(waiting_texts: int, running_texts: int, served_since: float, seconds_per_text: float | None) -> float:
    """When waiting texts may go in a call beside the running one, whose encoding began at `served_since`:
    at once when they are as many as it carries (waiting longer would only make the next call larger than
    this one, while the encoder may run out of work); else once what is left of it is one text's encoding,
    so that texts still arriving join them. Before any call has been timed (or with nothing waiting): never."""
    if seconds_per_text is None or waiting_texts < 1:
        return math.inf
    if waiting_texts >= running_texts:
        return served_since
    return served_since + (running_texts - 1) * seconds_per_text


class EmbeddingQueueFullError(OverloadedError):
    """More encoding waits in this gateway's queue for Triton than `TRITON_MAX_QUEUE_SECONDS`: the texts are
    refused at once (429 `overloaded`) rather than queued until their deadline.

    Do: client: retry after `Retry-After` seconds, with back-off, or send fewer texts at once; operator: the
    model's capacity is spent: more Triton replicas or GPUs (`gateway_model_queue_rejections_total{queue="gateway"}`).
    """

    def __init__(self, wait_seconds: float) -> None:
        super().__init__(
            f"embedding queue full: about {wait_seconds:.1f} s of encoding waits already; retry shortly",
            retry_after=max(1, math.ceil(wait_seconds)),
        )


@dataclass
class _Waiting:
    texts: list[str]
    result: asyncio.Future[TritonEmbeddings]


class CoalescingEmbedder:
    """An `Embedder` over another one; calls beyond `max_in_flight` are merged into the next call."""

    def __init__(
        self,
        inner: Embedder,
        *,
        max_in_flight: int = 1,
        max_texts: int | None = None,
        max_queue_seconds: float = math.inf,
        pace: EncoderPace | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_in_flight < 1 or (max_texts is not None and max_texts < 1):
            raise ValueError("max_in_flight and max_texts must be >= 1")
        if max_queue_seconds <= 0:
            raise ValueError("max_queue_seconds must be positive")
        self._max_queue_seconds = max_queue_seconds
        self._inner = inner
        self._max_in_flight = max_in_flight
        self._max_texts_given = max_texts  # None: the model's max batch size, so that a call is one Triton batch
        self._max_texts = max_texts or 1
        self._pace = pace or EncoderPace()
        self._clock = clock
        self._in_flight = 0
        self._running: dict[int, tuple[int, float]] = {}  # call number -> (texts, sent at)
        self._calls_sent = 0
        self._waiting: deque[_Waiting] = deque()
        self._waiting_texts = 0
        self._calls: set[asyncio.Task[None]] = set()
        self._recheck: asyncio.TimerHandle | None = None  # when the waiting texts become worth a call of their own
        self._recheck_due = math.inf

    async def model_info(self, *, refresh: bool = False) -> ModelInfo:
        return await self._inner.model_info(refresh=refresh)

    async def ready(self) -> bool:
        return await self._inner.ready()

    def set_max_in_flight(self, calls: int) -> None:
        """Change `max_in_flight` (the GPU policy lowers it while the GPUs are throttled): calls already running
        beyond a lowered limit finish; under a raised one the waiting texts go at once."""
        if calls < 1:
            raise ValueError("max_in_flight must be >= 1")
        self._max_in_flight = calls
        self._dispatch()

    async def embed(self, texts: list[str]) -> TritonEmbeddings:
        if self._goes_at_once():
            self._in_flight += 1
            call = self._started(len(texts))
            served = False
            try:
                result = await self._inner.embed(texts)
                served = True
                return result
            finally:
                self._ended(call, served=served)
                self._in_flight -= 1
                self._dispatch()
        if self._max_texts_given is None:
            self._max_texts = (await self._inner.model_info()).max_batch_size
        # Judged after the await and with none before the append: callers that awaited together would otherwise
        # all pass on the same queue.
        wait = self.wait_ahead()
        if wait > self._max_queue_seconds and not self._goes_at_once():
            metrics.MODEL_QUEUE_REJECTIONS.labels(queue="gateway").inc()
            raise EmbeddingQueueFullError(wait)
        waiting = _Waiting(texts, asyncio.get_running_loop().create_future())
        self._waiting.append(waiting)
        self._waiting_texts += len(texts)
        self._dispatch()
        # The merged call runs in its own task: a caller that goes away cancels only its own future.
        return await waiting.result

    def wait_ahead(self) -> float:
        """Seconds of encoding ahead of texts that join the queue now: what is left of the running calls, then the
        texts already waiting, at the encoder's pace (0 before any call has been timed: nothing to judge by)."""
        seconds_per_text = self._pace.seconds_per_text
        if seconds_per_text is None:
            return 0.0
        running = self._running.values()
        left = 0.0
        if running:
            since = min(self._pace.served_from(sent) for _, sent in running)
            work = sum(texts for texts, _ in running) * seconds_per_text
            left = max(0.0, work - (self._clock() - since))
        # Callers that went away are still queued until a dispatch skips them: their texts wait for nothing.
        queued = sum(len(waiting.texts) for waiting in self._waiting if not waiting.result.done())
        return left + queued * seconds_per_text

    def _goes_at_once(self) -> bool:
        return self._in_flight < self._max_in_flight and not self._waiting

    def _started(self, texts: int) -> int:
        self._calls_sent += 1
        self._running[self._calls_sent] = (texts, self._clock())
        return self._calls_sent

    def _ended(self, call: int, *, served: bool) -> None:
        """`call` is no longer running; only one the encoder `served` times its pace: a failed, timed-out or
        cancelled call ended at no telling point of its work, and would skew the queue bound's refusals."""
        texts, started = self._running.pop(call)
        if served:
            self._pace.observe(texts, started, self._clock())

    def _slot_free(self) -> bool:
        if self._in_flight < self._max_in_flight:
            return True
        return self._clock() >= self._overlap_from()

    def _overlap_from(self) -> float:
        """When one call more may go (never more than one beyond `max_in_flight`); the running call that ends
        first is the one the waiting texts would otherwise wait for."""
        if self._in_flight != self._max_in_flight or not self._running:
            return math.inf
        pace = self._pace
        return min(
            overlap_from(self._waiting_texts, texts, pace.served_from(sent), pace.seconds_per_text)
            for texts, sent in self._running.values()
        )

    def _dispatch(self) -> None:
        while self._waiting and self._slot_free():
            batch: list[_Waiting] = []
            size = 0
            limit = self._call_limit()
            while self._waiting and (not batch or size + len(self._waiting[0].texts) <= limit):
                waiting = self._waiting.popleft()
                self._waiting_texts -= len(waiting.texts)
                if not waiting.result.done():  # skip callers that have gone
                    batch.append(waiting)
                    size += len(waiting.texts)
            if not batch:
                return
            self._in_flight += 1
            texts = [text for waiting in batch for text in waiting.texts]
            task = asyncio.create_task(self._call(batch, texts, self._started(len(texts))))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)
        self._schedule_recheck()

    def _call_limit(self) -> int:
        """Texts the next call may take. An overlapping call takes at most half of what the running call and the
        waiting texts hold together, or twice the running call if that is more: in a closed loop each call's
        texts come back as the next call, so sizes persist, and an overlapping call that took everything (the
        first call of a burst is often a single text) would leave the calls to take turns at a large and a small
        size for good. Below twice the running call, the texts a strict half left behind made calls of one or
        two texts at low concurrency, each waiting a whole call more."""
        if self._in_flight < self._max_in_flight or not self._running:
            return self._max_texts
        running = min(texts for texts, _ in self._running.values())
        return min(self._max_texts, max(2 * running, math.ceil((running + self._waiting_texts) / 2)))

    def _schedule_recheck(self) -> None:
        """What is left of the running calls shrinks as they run, with no event to tell: wake up when the
        waiting texts will be worth an overlapping call."""
        due = self._overlap_from() if self._waiting else math.inf
        if self._recheck is not None:
            if self._recheck_due == due:
                return  # each arrival would otherwise replace the timer with the same one
            self._recheck.cancel()
            self._recheck = None
        if due < math.inf:
            self._recheck = asyncio.get_running_loop().call_later(max(0.0, due - self._clock()), self._rechecked)
            self._recheck_due = due

    def _rechecked(self) -> None:
        self._recheck = None
        self._dispatch()

    async def _call(self, batch: list[_Waiting], texts: list[str], call: int) -> None:
        served = False
        try:
            metrics.EMBEDDING_COALESCED_REQUESTS.observe(len(batch))
            try:
                merged = await self._inner.embed(texts)
                served = True
            except InvalidRequestError:
                if len(batch) == 1:
                    raise
                await self._call_each(batch)  # one caller's bad text must not fail the others
                return
            start = 0
            for waiting in batch:
                end = start + len(waiting.texts)
                _resolve(waiting, _rows(merged, start, end))
                start = end
        except Exception as exc:
            for waiting in batch:
                if not waiting.result.done():
                    waiting.result.set_exception(exc)
        finally:
            self._ended(call, served=served)
            self._in_flight -= 1
            self._dispatch()

    async def _call_each(self, batch: list[_Waiting]) -> None:
        async def one(waiting: _Waiting) -> None:
            try:
                _resolve(waiting, await self._inner.embed(waiting.texts))
            except Exception as exc:
                if not waiting.result.done():
                    waiting.result.set_exception(exc)

        await asyncio.gather(*(one(waiting) for waiting in batch))


def _rows(merged: TritonEmbeddings, start: int, end: int) -> TritonEmbeddings:
    return TritonEmbeddings(
        vectors=np.ascontiguousarray(merged.vectors[start:end]),
        token_counts=merged.token_counts[start:end],
        truncated=merged.truncated[start:end],
    )


def _resolve(waiting: _Waiting, result: TritonEmbeddings) -> None:
    if not waiting.result.done():  # its caller may have gone, and its future with it
        waiting.result.set_result(result)
