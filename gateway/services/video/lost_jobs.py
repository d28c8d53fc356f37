"""Finding, in fal's request history, the job of a submit whose answer was lost (the gateway died during the call,
or it timed out), so that the task adopts it instead of paying for a second one.

A task's attempt is recorded before its call (`Task.submitting_since`), so its job, if fal made one, is a request
to the task's endpoint, received within the call's time after that moment, whose input equals the task's
arguments. fal lists a request once it has ended (`FalRequestHistory`), so a lost job shows up only when it is
done: the submitter looks again every `lost_job_lookup_seconds` until `unknown_submit_wait_seconds` after the
call began, then submits again. Two tasks with equal arguments may both be looking: each job is claimed by one
task (a lease named after the job, held by the task), and the jobs that tasks got the normal way are claimed too,
so no task takes a job another one tracks. A claimed job has ended already, so the others that match are left as
they are (a cancel cannot stop them any more) for another task with the same arguments to claim.
A history that cannot be read costs nothing but the lookup: the task waits and submits again as without one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from gateway import metrics
from gateway.errors import GatewayError
from gateway.services.video.ledger import TaskLedger
from gateway.tasks.base import Lease
from gateway.tasks.model import Task
from gateway.upstreams.fal_history import FalRequestRecord

log = logging.getLogger(__name__)

CLOCK_SLACK_SECONDS = 5.0  # fal's clock against this host's, either way, and the submit's way there
REUSE_SECONDS = 1.0  # tasks lost in one crash look at once: one listing (or failure) serves the lookups of this long


class RequestHistory(Protocol):
    async def succeeded_since(self, start: float) -> list[FalRequestRecord]: ...


class LostJobFinder:
    def __init__(
        self,
        history: RequestHistory | None,
        ledger: TaskLedger,
        *,
        submit_call_seconds: float,
        claim_seconds: float,
    ) -> None:
        self._history = history
        self._ledger = ledger
        self._submit_call_seconds = submit_call_seconds  # the longest a submit call can take
        self._claim_seconds = claim_seconds
        self._lock = asyncio.Lock()
        # (monotonic, start, the records or why there are none): the last listing
        self._listing: tuple[float, float, list[FalRequestRecord] | GatewayError] | None = None

    @property
    def enabled(self) -> bool:
        return self._history is not None

    def claim_lease(self, task_id: str, request_id: str) -> Lease:
        """The lease that marks job `request_id` as `task_id`'s (a submit takes it with the record of its job)."""
        return Lease(f"job:{request_id}", task_id, self._claim_seconds)

    async def claim(self, task_id: str, request_id: str) -> bool:
        """Mark job `request_id` as `task_id`'s (again: True); False while another task holds it."""
        return await self._ledger.acquire_lease(self.claim_lease(task_id, request_id))

    async def find(self, task: Task) -> str | None:
        """The request id of the job of `task`'s current attempt, claimed for the task; None when the history
        has none (yet) or cannot be read."""
        began = task.submitting_since
        if self._history is None or began is None:
            return None
        try:
            records = await self._records(self._history, began - CLOCK_SLACK_SECONDS)
            for record in sorted(filter(lambda record: self._matches(record, task, began), records), key=_sent):
                if await self.claim(task.id, record.request_id):
                    metrics.VIDEO_LOST_JOB_LOOKUPS.labels(result="found").inc()
                    return record.request_id
        except GatewayError as exc:  # the history, or the store for the claim
            metrics.VIDEO_LOST_JOB_LOOKUPS.labels(result="unavailable").inc()
            log.warning("video task's lost job not looked up: %s", exc.message, extra={"task_id": task.id})
            return None
        metrics.VIDEO_LOST_JOB_LOOKUPS.labels(result="not_found").inc()
        return None

    def _matches(self, record: FalRequestRecord, task: Task, began: float) -> bool:
        sent = _sent(record)
        latest = began + self._submit_call_seconds + CLOCK_SLACK_SECONDS
        return began - CLOCK_SLACK_SECONDS <= sent <= latest and record.json_input == task.arguments

    async def _records(self, history: RequestHistory, start: float) -> list[FalRequestRecord]:
        async with self._lock:  # lookups at once wait for one listing rather than each making theirs
            cached = self._listing
            if cached is None or time.monotonic() - cached[0] >= REUSE_SECONDS or cached[1] > start:
                try:
                    listing: list[FalRequestRecord] | GatewayError = await history.succeeded_since(start)
                except GatewayError as exc:  # a history that hangs holds the next lookups up once, not each
                    listing = exc
                cached = self._listing = (time.monotonic(), start, listing)
            if isinstance(cached[2], GatewayError):
                raise cached[2]
            return cached[2]


def _sent(record: FalRequestRecord) -> float:
    """When fal received the request (its start when the receipt is not given); unknown: never matches."""
    moment = record.sent_at if record.sent_at is not None else record.started_at
    return moment if moment is not None else float("-inf")
