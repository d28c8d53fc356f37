"""The tritonclient a Triton call goes through, replaced by a fresh one once it is `TRITON_CHANNEL_MAX_AGE_SECONDS` old.

gRPC's DNS resolver resolves the name again only when a connection drops (grpc/grpc#12295), and Triton has no
max-connection-age option that would drop them for us: with one channel for the life of the process, Triton pods
added later would get no calls from this gateway. A fresh client is a fresh channel, whose resolver resolves the
name anew. The replacement happens on the next call after the age is reached (no timer task), costs that call a
connection handshake, and cuts nothing: calls finish on the client they started on, and a replaced client is
closed, in a task, when its last call ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import tritonclient.grpc.aio as grpcaio

from gateway import metrics


@dataclass(eq=False)
class _Generation:
    """One client and the calls in flight on it."""

    client: grpcaio.InferenceServerClient
    opened_at: float
    calls: int = 0
    replaced: bool = False


class AgingClient:
    """Hands out the current tritonclient per call; `max_age_seconds` 0 keeps the first one for ever."""

    def __init__(self, open_client: Callable[[], grpcaio.InferenceServerClient], max_age_seconds: float) -> None:
        self._open_client = open_client
        self._max_age = max_age_seconds
        self._open: set[_Generation] = set()  # the current one and replaced ones with calls in flight
        self._closing: set[asyncio.Task[None]] = set()
        self._current = self._new_generation()

    @property
    def open_clients(self) -> int:
        """Clients not closed yet: 1, plus replaced ones whose calls have not ended."""
        return len(self._open)

    @contextmanager
    def lease(self) -> Iterator[grpcaio.InferenceServerClient]:
        """The client for one call; the call must end inside the block."""
        generation = self._current_generation()
        generation.calls += 1
        try:
            yield generation.client
        finally:
            generation.calls -= 1
            if generation.replaced and generation.calls == 0:
                self._close_later(generation)

    def retire(self) -> None:
        """Hand out no client any more: the current one is closed when its last call ends (its address is gone)."""
        current = self._current
        current.replaced = True
        self._max_age = 0.0
        if current.calls == 0:
            self._close_later(current)

    async def aclose(self) -> None:
        """Close every client now (calls still in flight are cancelled), and wait for those being closed."""
        generations, self._open = list(self._open), set()
        for generation in generations:
            generation.replaced = True
            metrics.TRITON_CHANNELS.dec()
        await asyncio.gather(*(g.client.close() for g in generations), *self._closing, return_exceptions=True)

    def _current_generation(self) -> _Generation:
        current = self._current
        if self._max_age > 0 and time.monotonic() - current.opened_at >= self._max_age and current in self._open:
            current.replaced = True
            self._current = self._new_generation()
            if current.calls == 0:
                self._close_later(current)
        return self._current

    def _new_generation(self) -> _Generation:
        generation = _Generation(self._open_client(), time.monotonic())
        self._open.add(generation)
        metrics.TRITON_CHANNELS.inc()
        return generation

    def _close_later(self, generation: _Generation) -> None:
        if generation not in self._open:
            return  # closed by aclose
        self._open.discard(generation)
        metrics.TRITON_CHANNELS.dec()
        task = asyncio.create_task(generation.client.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
