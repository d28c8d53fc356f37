"""Ends what must end: tasks past their deadline, records past their retention, and upstream jobs that no
task tracks (the job of a cancelled or timed-out task, or one whose acceptance could not be recorded)."""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from typing import Protocol

from gateway import metrics
from gateway.errors import GatewayError
from gateway.services.video.ledger import TaskLedger
from gateway.services.video.steps import TaskSteps
from gateway.tasks.base import PURGE_EVERY_SECONDS
from gateway.tasks.model import Task
from gateway.upstreams.fal import FalSubmission

log = logging.getLogger(__name__)


class CancelQueue(Protocol):
    def submission_of(self, request_id: str) -> FalSubmission: ...

    async def cancel(self, cancel_url: str) -> bool: ...


class VideoReaper:
    def __init__(self, ledger: TaskLedger, upstream: CancelQueue, steps: TaskSteps) -> None:
        self._ledger = ledger
        self._upstream = upstream
        self._steps = steps
        self._stops: set[asyncio.Task[None]] = set()  # cancels of jobs whose acceptance was not recorded
        self._last_purge = float("-inf")

    async def aclose(self, drain_seconds: float) -> None:
        """Give the stops of untracked jobs up to `drain_seconds`: cut off, their jobs would run untracked."""
        if self._stops:
            await asyncio.wait(self._stops, timeout=drain_seconds)

    async def time_out(self, task_id: str) -> None:
        """Fail the task if its deadline has passed (and cancel its job)."""

        def decide(task: Task) -> Task | None:
            if task.state.terminal or self._ledger.clock() < task.deadline_at:
                return None
            seconds = task.deadline_at - task.created_at
            return self._ledger.failed(task, "timeout", f"the task did not finish within {seconds:g} s")

        task, changed = await self._ledger.change(task_id, decide)
        if changed:
            self.cancel_upstream(task)

    def cancel_upstream(self, task: Task) -> None:
        """Ask the upstream to drop the task's job, in the background; a failure only costs upstream compute."""
        if task.cancel_url is not None:
            self.cancel_job(task.id, task.cancel_url)

    def cancel_job(self, task_id: str, cancel_url: str) -> None:
        self._steps.spawn(self._cancel(task_id, cancel_url))

    def cancel_orphan(self, task_id: str, request_id: str) -> None:
        """Cancel a job of `task_id` that the task does not track (an earlier attempt's, found by its webhook):
        one that is still running stops costing; one that has ended answers that it has."""
        metrics.VIDEO_ORPHAN_JOBS.inc()
        log.info("cancelling an untracked upstream job", extra={"task_id": task_id, "request_id": request_id})
        self.cancel_job(task_id, self._upstream.submission_of(request_id).cancel_url)

    def stop_if_untracked(self, task_id: str, submission: FalSubmission) -> None:
        """The record of an accepted submission failed (store down, or cut off): the task stays pending and is
        submitted again, and nobody would track this job; stop it, unless the record was written after all.
        Not a background step: closing waits for it (`aclose`)."""
        stop = asyncio.get_running_loop().create_task(self._stop_if_untracked(task_id, submission))
        self._stops.add(stop)
        stop.add_done_callback(self._stops.discard)

    async def purge_if_due(self, now: float) -> None:
        """Delete expired tasks, at most every `PURGE_EVERY_SECONDS`."""
        if now - self._last_purge < PURGE_EVERY_SECONDS:
            return
        self._last_purge = now
        purged = await self._ledger.purge_expired()
        if purged:
            log.info("expired video tasks purged", extra={"count": purged})

    async def _stop_if_untracked(self, task_id: str, submission: FalSubmission) -> None:
        with suppress(GatewayError):
            if (await self._ledger.get(task_id)).upstream_request_id == submission.request_id:
                return
        await self._cancel(task_id, submission.cancel_url)

    async def _cancel(self, task_id: str, cancel_url: str) -> None:
        try:
            await self._upstream.cancel(cancel_url)
        except GatewayError as exc:
            log.warning("upstream cancel failed: %s", exc.message, extra={"task_id": task_id})
