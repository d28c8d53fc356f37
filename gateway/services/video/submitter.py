"""Submitting pending tasks to the upstream: a local queue, a submit lease renewed while the call runs,
a quota slot per call, the outcome recorded (or a retry with back-off), and a drain on close.

The replica that accepts a task creates it together with its submit lease and queues it here
(`enqueue_created`), so it submits at once with no read; the scanner queues the tasks of other (or
dead) replicas that fall due. Only a pending task is ever submitted, and an accepted job whose record
did not stick is cancelled (`VideoReaper.stop_if_untracked`), so a task never runs twice at the upstream.

fal's queue takes no idempotency key, so a submit whose answer is lost (the process dies during the call,
or the call times out) leaves a job the task may never hear of. Each call is therefore recorded before it
is made (`Task.attempt`, `Task.submitting_since`) and the attempt's number is in the job's webhook URL. A
task found with an attempt of unknown outcome is not submitted again until `unknown_submit_wait_seconds`
after that call began: the job's webhook, if fal has the job, adopts it meanwhile (`adopt`), and so does fal's
request history once the job has ended there (`LostJobFinder`, looked up every `lost_job_lookup_seconds` meanwhile
and once more before the new attempt). A job of an attempt that is no longer current, found by its webhook later,
is cancelled (`VideoService.handle_callback`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any, Protocol

from gateway import metrics
from gateway.errors import GatewayError, InvalidRequestError, NotFoundError
from gateway.quota.base import QuotaLimiter
from gateway.services.video.ledger import TaskLedger
from gateway.services.video.lost_jobs import LostJobFinder
from gateway.services.video.reaper import VideoReaper
from gateway.services.video.steps import RunnerConfig, TaskSteps, backoff
from gateway.tasks.base import Lease, TaskStoreError
from gateway.tasks.model import Task, TaskState
from gateway.upstreams.fal import FalSubmission, VideoTimeoutError
from gateway.upstreams.webhooks import WebhookUrls

log = logging.getLogger(__name__)

SUBMIT_DRAIN_SECONDS = 5.0  # on close, for submits already at the upstream to record their outcome


class SubmitQueue(Protocol):
    async def submit(self, arguments: dict[str, Any], webhook_url: str | None = None) -> FalSubmission: ...

    def submission_of(self, request_id: str) -> FalSubmission: ...


def _not_due(task: Task, now: float) -> bool:
    return (task.next_attempt_at or 0.0) > now


class VideoSubmitter:
    def __init__(
        self,
        ledger: TaskLedger,
        upstream: SubmitQueue,
        quota: QuotaLimiter,
        webhook_urls: WebhookUrls,
        steps: TaskSteps,
        reaper: VideoReaper,
        config: RunnerConfig,
        finder: LostJobFinder,
        *,
        owner: str,
    ) -> None:
        self._ledger = ledger
        self._upstream = upstream
        self._finder = finder
        self._quota = quota
        self._webhook_urls = webhook_urls
        self._steps = steps
        self._reaper = reaper
        self._owner = owner  # this replica's name on leases
        self._config = config
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._created: dict[str, tuple[Task, float]] = {}  # by `enqueue_created`: record, when its lease was taken
        self._workers: list[asyncio.Task[None]] = []
        self._submits: set[asyncio.Task[None]] = set()
        self._at_upstream: set[asyncio.Task[Any]] = set()  # submits past their quota wait, until recorded

    def start(self) -> None:
        self._workers = [asyncio.create_task(self._submit_worker()) for _ in range(self._config.max_concurrent_submits)]

    async def aclose(self, drain_seconds: float = SUBMIT_DRAIN_SECONDS) -> None:
        """Stop. A submit already at the upstream gets up to `drain_seconds` to record its outcome: cut
        between the upstream's acceptance and the record, its job would run untracked and the task be
        submitted again (a paid duplicate). Submits still waiting for the quota are cancelled at once."""
        for task in [*self._workers, *(self._submits - self._at_upstream)]:
            task.cancel()
        if self._at_upstream:
            await asyncio.wait(self._at_upstream, timeout=drain_seconds)
        tasks = [*self._workers, *self._submits]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def submit_lease(self, task_id: str) -> Lease:
        """The lease a replica holds while it submits `task_id` upstream (renewed while the call runs)."""
        return Lease(f"submit:{task_id}", self._owner, self._config.lease_seconds)

    def enqueue_created(self, task: Task, leased_at: float) -> None:
        """Queue a task this replica has just created together with its `submit_lease` (requested at
        `leased_at`, monotonic): the submit starts from that record under that lease, with no read. A
        cancel meanwhile is seen when the outcome is recorded (the upstream job is then cancelled)."""
        self._created[task.id] = (task, leased_at)
        self.enqueue(task.id)

    def enqueue(self, task_id: str) -> None:
        if task_id not in self._queued and not self._steps.busy(task_id):
            self._queued.add(task_id)
            self._queue.put_nowait(task_id)

    async def _submit_worker(self) -> None:
        while True:
            task_id = await self._queue.get()
            self._queued.discard(task_id)
            # In its own task, which `aclose` may let finish after this worker is cancelled.
            submit = asyncio.create_task(self._steps.exclusive(task_id, self._submit(task_id)))
            self._submits.add(submit)
            submit.add_done_callback(self._submits.discard)
            submit.add_done_callback(self._at_upstream.discard)
            await asyncio.shield(submit)

    async def _submit(self, task_id: str) -> None:
        lease = self.submit_lease(task_id)
        task, leased_at = self._created.pop(task_id, (None, 0.0))
        if task is None:
            leased_at = time.monotonic()
            if not await self._ledger.acquire_lease(lease):
                return  # another replica is submitting it
        still_pending = True
        try:
            if task is None:
                task = await self._ledger.get(task_id)
            now = self._ledger.clock()
            if task.state != TaskState.PENDING or _not_due(task, now):
                return
            if now >= task.deadline_at:
                await self._reaper.time_out(task_id)
                return
            if task.submitting_since is not None:
                adopted = await self._adopt_lost_job(task)
                if adopted is not None:
                    still_pending = adopted.state == TaskState.PENDING
                    return
                if now < self._resume_at(task):
                    await self._ledger.change(task_id, self._wait_for_unknown, known=task)
                    return  # its job's webhook (or its entry in the history) may still come and adopt it
            still_pending = (await self._submit_pending(task, lease, leased_at)).state == TaskState.PENDING
        finally:
            # Only a pending task is ever submitted: a lease on one that has moved on guards nothing, and
            # lapses by itself (one command fewer per task).
            if still_pending:
                await self._ledger.release_lease(lease)

    async def _holding(self, task: Task, lease: Lease, leased_at: float) -> Task | None:
        """`task` if this replica's submit lease (taken at `leased_at`, monotonic) has at least half its time
        left; else the lease renewed and the task read again (it may have moved on while the lease was short
        or had lapsed, in a long quota wait); None if another replica holds the lease."""
        if time.monotonic() + lease.ttl_seconds / 2 <= leased_at + lease.ttl_seconds:
            return task
        if not await self._ledger.acquire_lease(lease):
            return None
        return await self._ledger.get(task.id)

    @asynccontextmanager
    async def _renewing(self, lease: Lease) -> AsyncIterator[None]:
        """Keep `lease` while the block runs, renewing it every third of its time: an upstream call may take
        longer than the lease, and another replica must not submit the task meanwhile (a paid duplicate);
        a replica that dies still loses it within one lease. Most calls end before the first renewal."""

        async def renew() -> None:
            while True:
                await asyncio.sleep(lease.ttl_seconds / 3)
                try:
                    if not await self._ledger.acquire_lease(lease):
                        log.warning(
                            "video task submit lease lost during the upstream call", extra={"lease": lease.name}
                        )
                        return
                except TaskStoreError as exc:
                    log.warning("video task submit lease not renewed: %s", exc.message, extra={"lease": lease.name})

        renewal = asyncio.create_task(renew())
        try:
            yield
        finally:
            renewal.cancel()
            with suppress(asyncio.CancelledError):
                await renewal

    async def _submit_pending(self, task: Task, lease: Lease, leased_at: float) -> Task:
        """Submit `task` upstream under `lease` and record the outcome; the stored task afterwards."""
        callback = None
        try:
            async with self._quota.slot():  # its wait may outlast a lease: checked once a slot is free
                current = await self._holding(task, lease, leased_at)
                if current is None or current.state != TaskState.PENDING or _not_due(current, self._ledger.clock()):
                    return current or task
                task, started = await self._ledger.change(task.id, self._start_attempt, known=current)
                if not started:
                    return task
                callback = self._webhook_urls.url(task.id, task.attempt)
                self._at_upstream.add(asyncio.current_task())  # type: ignore[arg-type]  # always in a task
                async with self._renewing(lease):
                    submission = await self._upstream.submit(task.arguments, callback)
        except VideoTimeoutError as exc:  # it may have reached the upstream: the job may exist
            metrics.VIDEO_UPSTREAM_SUBMITS.labels(result="unknown").inc()
            log.warning("video task submit timed out, outcome unknown: %s", exc.message, extra={"task_id": task.id})
            stored, _ = await self._ledger.change(task.id, self._retry_later, known=task)
            return stored
        except (InvalidRequestError, NotFoundError) as exc:
            metrics.VIDEO_UPSTREAM_SUBMITS.labels(result="rejected").inc()
            reason = exc.message
            stored, _ = await self._ledger.change(
                task.id, lambda t: self._ledger.failed(t, "upstream_rejected", reason), known=task
            )
            return stored
        except GatewayError as exc:  # unavailable, timeout, quota, 5xx: try again later, until the deadline
            metrics.VIDEO_UPSTREAM_SUBMITS.labels(result="retry").inc()
            log.warning("video task submit failed, will retry: %s", exc.message, extra={"task_id": task.id})
            stored, _ = await self._ledger.change(task.id, self._known_failure, known=task)
            return stored
        metrics.VIDEO_UPSTREAM_SUBMITS.labels(result="accepted").inc()
        now = self._ledger.clock()
        wait = self._config.callback_grace_seconds if callback else self._config.poll_initial_seconds
        # The job is claimed for the task (no other task with the same arguments may adopt it from the history)
        # with its record: one store round trip per task fewer than a claim of its own.
        claim = self._finder.claim_lease(task.id, submission.request_id) if self._finder.enabled else None
        try:
            stored, recorded = await self._ledger.change(
                task.id,
                lambda t: self._accepted(t, submission, now, wait, attempt=task.attempt),
                known=task,
                lease=claim,
            )
        except BaseException:
            self._reaper.stop_if_untracked(task.id, submission)
            raise
        if stored.upstream_request_id != submission.request_id:
            # The task ended while this job was being submitted (cancel, timeout, or the webhook of an
            # earlier submission): nobody tracks this job, so stop it.
            self._reaper.cancel_job(task.id, submission.cancel_url)
        elif not recorded and claim is not None:  # its webhook adopted the job first: claimed on its own
            with suppress(GatewayError):  # unclaimed, it may at worst be shared: never run twice
                await self._finder.claim(task.id, submission.request_id)
        return stored

    def adopt(self, task: Task, request_id: str) -> Task:
        """`task`, pending on an attempt whose submit answer was lost, as if that answer had come: its job is
        `request_id` (named by the job's webhook). The webhook is then applied to the result."""
        now = self._ledger.clock()
        return self._record(task, self._upstream.submission_of(request_id), now, self._config.callback_grace_seconds)

    async def _adopt_lost_job(self, task: Task) -> Task | None:
        """`task` with the job of its current attempt found in fal's request history (the stored task), or None
        when none is found (yet). The job has ended there: it is polled at once."""
        request_id = await self._finder.find(task)
        if request_id is None:
            return None
        attempt = task.attempt

        def adopted(current: Task) -> Task | None:
            if current.state != TaskState.PENDING or current.attempt != attempt or current.submitting_since is None:
                return None
            now = self._ledger.clock()
            return self._record(current, self._upstream.submission_of(request_id), now, 0.0)

        stored, changed = await self._ledger.change(task.id, adopted, known=task)
        if changed:
            log.info("video task adopted its lost job from the upstream's history", extra={"task_id": task.id})
        return stored

    def _start_attempt(self, task: Task) -> Task | None:
        """The record of a submit call about to be made, written before it (see the module docstring); the next
        scan after a crash comes no sooner than its first look for the job (`_next_look`), nor while its lease may
        be held."""
        if task.state != TaskState.PENDING:
            return None
        now = self._ledger.clock()
        hold = max(self._next_look(now, now) - now, self._config.lease_seconds)
        return task.moved(
            TaskState.PENDING, now, attempt=task.attempt + 1, submitting_since=now, next_attempt_at=now + hold
        )

    def _resume_at(self, task: Task) -> float:
        """When a task whose last submit's outcome is unknown may be submitted again."""
        return (task.submitting_since or 0.0) + self._config.unknown_submit_wait_seconds

    def _next_look(self, since: float, now: float) -> float:
        """When a task whose last submit (begun at `since`) has an unknown outcome is looked at next: the
        history's next lookup, or when it may be submitted again (without a history, only then)."""
        resume_at = since + self._config.unknown_submit_wait_seconds
        if self._finder.enabled:
            return min(resume_at, now + self._config.lost_job_lookup_seconds)
        return resume_at

    def _wait_for_unknown(self, task: Task) -> Task | None:
        if task.state != TaskState.PENDING or task.submitting_since is None:
            return None
        now = self._ledger.clock()
        look_at = self._next_look(task.submitting_since, now)
        if task.next_attempt_at is not None and task.next_attempt_at >= look_at:
            return None
        return task.moved(TaskState.PENDING, now, next_attempt_at=look_at)

    def _accepted(self, task: Task, submission: FalSubmission, now: float, wait: float, *, attempt: int) -> Task | None:
        if task.state != TaskState.PENDING or task.attempt != attempt:
            return None  # cancelled, timed out, ended by an early webhook, or its attempt given up for a new one
        return self._record(task, submission, now, wait)

    def _record(self, task: Task, submission: FalSubmission, now: float, wait: float) -> Task:
        return task.moved(
            TaskState.PROCESSING,
            now,
            upstream_request_id=submission.request_id,
            status_url=submission.status_url,
            response_url=submission.response_url,
            cancel_url=submission.cancel_url,
            submitted_at=now,
            submit_attempts=task.submit_attempts + 1,
            submitting_since=None,
            next_attempt_at=None,
            poll_after=now + wait,
        )

    def _known_failure(self, task: Task) -> Task | None:
        """The upstream answered the call with an error: no job was made, so the retry need not wait for one."""
        if task.state != TaskState.PENDING:
            return None
        return self._retry_later(dataclasses.replace(task, submitting_since=None))

    def _retry_later(self, task: Task) -> Task | None:
        if task.state != TaskState.PENDING:
            return None
        now = self._ledger.clock()
        delay = backoff(self._config.retry_initial_seconds, self._config.retry_max_seconds, task.submit_attempts)
        if task.submitting_since is not None:  # a job may exist: its webhook (or the history) gets its time first
            delay = max(delay, self._next_look(task.submitting_since, now) - now)
        return task.moved(TaskState.PENDING, now, submit_attempts=task.submit_attempts + 1, next_attempt_at=now + delay)
