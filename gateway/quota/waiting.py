"""Waiting for the quota: the FIFO queue of one process, the wake-up on a freed slot, the refusal after
`max_wait_seconds`. Implementations say how to try the quota once and how to give a slot back."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from types import TracebackType
from typing import Self

from gateway import metrics
from gateway.errors import OverloadedError
from gateway.quota.base import Denial, Grant, QuotaConfig, Slot


class Wakeup:
    """Wakes the head of the queue as soon as this process frees a slot (a ticket taken before asking
    the limiter cannot miss a release that happens while the answer is on its way)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def ticket(self) -> asyncio.Event:
        return self._event

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, ticket: asyncio.Event, timeout: float) -> None:
        with suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await ticket.wait()


class WaitingLimiter:
    """`slot()` and the FIFO waiting loop; subclasses say how to try once and how to release."""

    def __init__(self, config: QuotaConfig, name: str, poll_seconds: float) -> None:
        self.config = config
        self.name = name
        self._poll_seconds = poll_seconds
        self._queue = asyncio.Lock()  # FIFO: only the head of the queue asks the limiter
        self._wakeup = Wakeup()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    @asynccontextmanager
    async def slot(self, estimated_tokens: int = 0) -> AsyncIterator[Slot]:
        """Wait for a request, a concurrency slot and the estimated tokens; release the slot on exit."""
        reserved = self._reservation(estimated_tokens)
        started = time.monotonic()
        grant = await self._admit(reserved, started + self.config.max_wait_seconds)
        slot = Slot(estimated_tokens, reserved, grant, time.monotonic() - started, self._pace)
        metrics.QUOTA_WAIT.labels(limiter=self.name).observe(slot.waited_seconds)
        try:
            yield slot
        finally:
            await self._release(grant, slot.token_correction)

    async def aclose(self) -> None:
        """Nothing to close in process; `RedisQuotaLimiter` closes its client."""

    async def _attempt(self, reserved: int) -> Grant | Denial:
        raise NotImplementedError

    async def _attempt_pace(self) -> Grant | Denial:
        raise NotImplementedError

    async def _release(self, grant: Grant, token_correction: int) -> None:
        raise NotImplementedError

    async def _pace(self) -> None:
        """Wait for the rate alone (`Slot.pace`). Not through the FIFO queue: its head may be waiting for the
        very slot this caller holds."""
        deadline = time.monotonic() + self.config.max_wait_seconds
        while not isinstance(verdict := await self._attempt_pace(), Grant):
            if verdict.wait_seconds > deadline - time.monotonic():
                raise self._refusal(verdict)
            await asyncio.sleep(verdict.wait_seconds)

    def _reservation(self, estimated_tokens: int) -> int:
        if estimated_tokens < 0:
            raise ValueError(f"estimated_tokens must be >= 0, got {estimated_tokens}")
        return min(estimated_tokens, self.config.tokens_per_minute or 0)

    async def _admit(self, reserved: int, deadline: float) -> Grant:
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await self._queue.acquire()
        except TimeoutError:
            raise self._refusal(Denial("queue", 0.0, reserved)) from None
        try:
            return await self._wait_for_grant(reserved, deadline)
        finally:
            self._queue.release()

    async def _wait_for_grant(self, reserved: int, deadline: float) -> Grant:
        while True:
            ticket = self._wakeup.ticket()
            verdict = await self._attempt(reserved)
            if isinstance(verdict, Grant):
                return verdict
            remaining = deadline - time.monotonic()
            if remaining <= 0 or verdict.wait_seconds > remaining:
                raise self._refusal(verdict)  # fail now rather than sleep into a certain refusal
            metrics.QUOTA_WAITS.labels(limiter=self.name, reason=verdict.reason).inc()
            if verdict.reason == "concurrency":
                await self._wakeup.wait(ticket, min(max(verdict.wait_seconds, self._poll_seconds), remaining))
            else:
                await asyncio.sleep(verdict.wait_seconds)

    def _refusal(self, denial: Denial) -> OverloadedError:
        config, wait = self.config, denial.wait_seconds
        limit = f"{config.max_wait_seconds:g} s allowed"
        details = {
            "rate": f"{config.requests_per_second:g} requests/s in use, next slot in {wait:.2f} s > {limit}",
            "concurrency": f"all {config.max_concurrent} concurrent calls busy, waited {config.max_wait_seconds:g} s",
            "tokens": f"{denial.reserved_tokens} tokens needed, {config.tokens_per_minute} tokens/minute in use, "
            f"enough in {wait:.1f} s > {limit}",
            "queue": f"still queued behind earlier calls after {config.max_wait_seconds:g} s",
        }
        message = f"{self.name} quota exhausted: {details[denial.reason]}; retry later"
        metrics.QUOTA_REFUSALS.labels(limiter=self.name, reason=denial.reason).inc()
        return OverloadedError(message, retry_after=max(1, math.ceil(wait)))
