"""Status polls of submitted tasks whose webhook is overdue, with back-off, and the fetch of their results.

A poll takes a short lease in the store first, so one replica at a time polls a task; the time of the
next poll is kept on the task (`poll_after`), so the back-off continues on whichever replica polls next.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from gateway import metrics
from gateway.errors import GatewayError, InvalidRequestError, NotFoundError
from gateway.services.video.ledger import TaskLedger
from gateway.services.video.steps import RunnerConfig, backoff
from gateway.tasks.base import Lease
from gateway.tasks.model import Task, TaskState
from gateway.upstreams.fal import FalStatus, FalSubmission, VideoUpstreamError

log = logging.getLogger(__name__)

MAX_CONCURRENT_POLLS = 64


class StatusQueue(Protocol):
    async def status(self, submission_or_status_url: FalSubmission | str) -> FalStatus: ...

    async def result(self, response_url: str) -> dict[str, Any]: ...


class VideoPoller:
    def __init__(
        self,
        ledger: TaskLedger,
        upstream: StatusQueue,
        config: RunnerConfig,
        *,
        owner: str,
    ) -> None:
        self._ledger = ledger
        self._upstream = upstream
        self._owner = owner  # this replica's name on leases
        self._config = config
        self._polls = asyncio.Semaphore(MAX_CONCURRENT_POLLS)

    async def poll(self, task_id: str) -> None:
        """Poll the task's job if it is processing and due, unless another replica polls it now."""
        lease = Lease(f"poll:{task_id}", self._owner, self._config.lease_seconds)
        async with self._polls:
            if not await self._ledger.acquire_lease(lease):
                return  # another replica polls it
            try:
                task = await self._ledger.get(task_id)
                due = task.poll_after is not None and task.poll_after <= self._ledger.clock()
                if task.state == TaskState.PROCESSING and due and task.status_url and task.response_url:
                    await self._poll_upstream(task, task.status_url, task.response_url)
            finally:
                await self._ledger.release_lease(lease)

    async def _poll_upstream(self, task: Task, status_url: str, response_url: str) -> None:
        try:
            status = await self._upstream.status(status_url)
        except NotFoundError as exc:  # the upstream has forgotten the job
            await self._polled_error(task, exc.message)
            return
        except GatewayError as exc:  # unavailable, timeout, a 5xx: poll again later
            await self._polled_transient_error(task, exc)
            return
        metrics.VIDEO_POLLS.labels(result=status.state.lower()).inc()
        if status.state != "COMPLETED":
            await self._ledger.change(task.id, self._poll_later, known=task)
            return
        try:
            payload = await self._upstream.result(response_url)
        except (InvalidRequestError, NotFoundError, VideoUpstreamError) as exc:
            await self._polled_error(task, exc.message)  # fal answers a failed job's result with its error
            return
        except GatewayError as exc:
            await self._polled_transient_error(task, exc)
            return
        await self._ledger.change(task.id, lambda t: self._end_by_polling(t, payload=payload), known=task)

    async def _polled_error(self, task: Task, message: str) -> None:
        metrics.VIDEO_POLLS.labels(result="failed").inc()
        await self._ledger.change(task.id, lambda t: self._end_by_polling(t, error=message), known=task)

    async def _polled_transient_error(self, task: Task, exc: GatewayError) -> None:
        metrics.VIDEO_POLLS.labels(result="error").inc()
        log.warning("video task poll failed: %s", exc.message, extra={"task_id": task.id})
        await self._ledger.change(task.id, self._poll_later, known=task)

    def _poll_later(self, task: Task) -> Task | None:
        if task.state != TaskState.PROCESSING:
            return None
        now = self._ledger.clock()
        delay = backoff(self._config.poll_initial_seconds, self._config.poll_max_seconds, task.polls)
        return task.moved(TaskState.PROCESSING, now, polls=task.polls + 1, poll_after=now + delay)

    def _end_by_polling(
        self, task: Task, *, payload: dict[str, Any] | None = None, error: str | None = None
    ) -> Task | None:
        if task.state.terminal:
            return None  # the webhook came in the meantime
        if error is not None:
            return self._ledger.failed(task, "upstream_error", error, completed_by="polling", polls=task.polls + 1)
        return self._ledger.ended(
            task, TaskState.COMPLETED, result=payload, completed_by="polling", polls=task.polls + 1, poll_after=None
        )
