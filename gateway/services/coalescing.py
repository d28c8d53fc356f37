"""Merge concurrent embedding calls into fewer, larger Triton calls.

Triton has a cost per request on top of the model (gRPC, the ensemble's scheduling, two
python-backend steps), so 32 single-text requests cost far more as 32 calls than as one.
`CoalescingEmbedder` sends a call at once while fewer than `max_in_flight` are running, so a quiet
gateway adds no delay; when all are busy, the texts that arrive wait for the next free slot and go
together, up to `max_texts` per call. Under load the batches grow by themselves, with no timer.

Once `overlap_texts` are waiting, one call more goes at once: it is tokenized and queued in Triton
while the call before it runs, so the encoder starts on it without waiting for a round trip through
the gateway, and it is large enough to cost little more per text than a merged call would.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

import numpy as np

from gateway import metrics
from gateway.errors import InvalidRequestError
from gateway.services.embeddings import Embedder
from gateway.upstreams.triton import ModelInfo, TritonEmbeddings

# The overlapping call must be large enough to cost little more per text than a merged call: with fewer
# texts the calls get too small and throughput drops below not overlapping at all; with more, the overlap
# happens only under heavier load. A gateway where this many never wait is unaffected.
OVERLAP_TEXTS = 16


@dataclass
class _Waiting:
    texts: list[str]
    result: asyncio.Future[TritonEmbeddings]


class CoalescingEmbedder:
    """An `Embedder` over another one; calls beyond `max_in_flight` are merged into the next call."""

    def __init__(
        self, inner: Embedder, *, max_in_flight: int = 1, max_texts: int = 64, overlap_texts: int = OVERLAP_TEXTS
    ) -> None:
        if max_in_flight < 1 or max_texts < 1:
            raise ValueError("max_in_flight and max_texts must be >= 1")
        self._inner = inner
        self._max_in_flight = max_in_flight
        self._max_texts = max_texts
        self._overlap_texts = overlap_texts
        self._in_flight = 0
        self._waiting: deque[_Waiting] = deque()
        self._waiting_texts = 0
        self._calls: set[asyncio.Task[None]] = set()

    async def model_info(self, *, refresh: bool = False) -> ModelInfo:
        return await self._inner.model_info(refresh=refresh)

    async def ready(self) -> bool:
        return await self._inner.ready()

    async def embed(self, texts: list[str]) -> TritonEmbeddings:
        if self._in_flight < self._max_in_flight and not self._waiting:
            self._in_flight += 1
            try:
                return await self._inner.embed(texts)
            finally:
                self._in_flight -= 1
                self._dispatch()
        waiting = _Waiting(texts, asyncio.get_running_loop().create_future())
        self._waiting.append(waiting)
        self._waiting_texts += len(texts)
        self._dispatch()
        # The merged call runs in its own task: a caller that goes away cancels only its own future.
        return await waiting.result

    def _slot_free(self) -> bool:
        if self._in_flight < self._max_in_flight:
            return True
        overlap = 0 < self._overlap_texts <= self._waiting_texts
        return overlap and self._in_flight == self._max_in_flight

    def _dispatch(self) -> None:
        while self._waiting and self._slot_free():
            batch: list[_Waiting] = []
            size = 0
            while self._waiting and (not batch or size + len(self._waiting[0].texts) <= self._max_texts):
                waiting = self._waiting.popleft()
                self._waiting_texts -= len(waiting.texts)
                if not waiting.result.done():  # skip callers that have gone
                    batch.append(waiting)
                    size += len(waiting.texts)
            if not batch:
                return
            self._in_flight += 1
            task = asyncio.create_task(self._call(batch))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    async def _call(self, batch: list[_Waiting]) -> None:
        try:
            metrics.EMBEDDING_COALESCED_REQUESTS.observe(len(batch))
            try:
                merged = await self._inner.embed([text for waiting in batch for text in waiting.texts])
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
