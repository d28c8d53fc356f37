"""The background side of video tasks: submitting to the upstream, polling, timeouts and expiry.

Each replica runs one `VideoTaskRunner`. Its scanner reads the unfinished tasks that are due (`Task.due_at`)
from the store every `scan_interval_seconds`, so a task survives any replica: a restarted or surviving replica finds it
still pending (and submits it) or processing (and polls it once its webhook is overdue). Submitting
and polling a task each take a short lease in the store first, so one replica at a time does it;
the time of the next attempt or poll is kept on the task, so the back-off continues wherever the
task goes next. New tasks are also queued locally, so the replica that accepted one submits it at once,
under the submit lease it took with the task (`enqueue_created`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, Protocol

from gateway import metrics
from gateway.errors import GatewayError, InvalidRequestError, NotFoundError
from gateway.services.video_ledger import TaskLedger
from gateway.tasks.base import Lease, TaskStoreError
from gateway.tasks.model import Task, TaskState
from gateway.upstreams.fal import FalStatus, FalSubmission, VideoUpstreamError
from gateway.upstreams.webhooks import WebhookUrls

log = logging.getLogger(__name__)
_jitter = random.Random()  # not the global generator, whose state belongs to the host program (and its tests)

PURGE_EVERY_SECONDS = 60.0
MAX_CONCURRENT_POLLS = 64
MAX_DUE_PER_SCAN = 500  # the earliest due first; the rest wait for the next scan
SUBMIT_DRAIN_SECONDS = 5.0  # on close, for submits already at the upstream to record their outcome


class VideoQueue(Protocol):
    """What the runner needs from the upstream client (`FalQueueClient`)."""

    async def submit(self, arguments: dict[str, Any], webhook_url: str | None = None) -> FalSubmission: ...

    async def status(self, submission_or_status_url: FalSubmission | str) -> FalStatus: ...

    async def result(self, response_url: str) -> dict[str, Any]: ...

    async def cancel(self, cancel_url: str) -> bool: ...


class SubmitQuota(Protocol):
    def slot(self, estimated_tokens: int = 0) -> AbstractAsyncContextManager[object]: ...


@dataclass(frozen=True)
class RunnerConfig:
    callback_grace_seconds: float = 30.0
    poll_initial_seconds: float = 1.0
    poll_max_seconds: float = 10.0
    lease_seconds: float = 30.0
    scan_interval_seconds: float = 1.0
    max_concurrent_submits: int = 4
    retry_initial_seconds: float = 1.0
    retry_max_seconds: float = 30.0


def _not_due(task: Task, now: float) -> bool:
    return (task.next_attempt_at or 0.0) > now


def backoff(first: float, most: float, attempt: int) -> float:
    return float(min(most, first * 2 ** min(attempt, 30)))


class VideoTaskRunner:
    def __init__(
        self,
        ledger: TaskLedger,
        upstream: VideoQueue,
        quota: SubmitQuota,
        webhook_urls: WebhookUrls,
        config: RunnerConfig,
        *,
        owner: str,
    ) -> None:
        self._ledger = ledger
        self._upstream = upstream
        self._quota = quota
        self._webhook_urls = webhook_urls
        self._config = config
        self._owner = owner  # this replica's name on leases
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._created: dict[str, tuple[Task, float]] = {}  # by `enqueue_created`: record, when its lease was taken
        self._busy: set[str] = set()  # tasks this replica is submitting, polling or timing out right now
        self._polls = asyncio.Semaphore(MAX_CONCURRENT_POLLS)
        self._background: set[asyncio.Task[None]] = set()
        self._submits: set[asyncio.Task[None]] = set()
        self._stops: set[asyncio.Task[None]] = set()  # cancels of jobs whose acceptance was not recorded
        self._at_upstream: set[asyncio.Task[Any]] = set()  # submits past their quota wait, until recorded
        self._loops: list[asyncio.Task[None]] = []
        self._last_purge = float("-inf")

    async def start(self) -> None:
        workers = [self._submit_worker() for _ in range(self._config.max_concurrent_submits)]
        self._loops = [asyncio.create_task(loop) for loop in (*workers, self._scan_forever())]

    async def aclose(self, drain_seconds: float = SUBMIT_DRAIN_SECONDS) -> None:
        """Stop. A submit already at the upstream gets up to `drain_seconds` to record its outcome: cut
        between the upstream's acceptance and the record, its job would run untracked and the task be
        submitted again (a paid duplicate). Submits still waiting for the quota are cancelled at once."""
        for task in [*self._loops, *(self._submits - self._at_upstream)]:
            task.cancel()
        if self._at_upstream:
            await asyncio.wait(self._at_upstream, timeout=drain_seconds)
        tasks = [*self._loops, *self._submits, *self._background]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._stops:  # started by the submits just cut off: their jobs must not run untracked
            await asyncio.wait(self._stops, timeout=drain_seconds)

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
        if task_id not in self._queued and task_id not in self._busy:
            self._queued.add(task_id)
            self._queue.put_nowait(task_id)

    def cancel_upstream(self, task: Task) -> None:
        """Ask the upstream to drop the job, in the background; a failure only costs upstream compute."""
        if task.cancel_url is not None:
            self._spawn(self._cancel_upstream(task.id, task.cancel_url))

    # -- scanning ----------------------------------------------------------------------------------

    async def scan_once(self) -> None:
        now = self._ledger.clock()
        counts = await self._ledger.count_unfinished()
        for state in (TaskState.PENDING, TaskState.PROCESSING):
            metrics.VIDEO_TASKS.labels(state=state.value).set(counts.get(state, 0))
        # Only the tasks due by now, from the store's index: the scan costs what is due, not what is open.
        for task in await self._ledger.due(now, MAX_DUE_PER_SCAN):
            if task.id in self._busy:
                continue
            if now >= task.deadline_at:
                self._spawn(self._exclusive(task.id, self._time_out(task.id)))
            elif task.state == TaskState.PENDING and (task.next_attempt_at or 0.0) <= now:
                self.enqueue(task.id)
            elif task.state == TaskState.PROCESSING and task.poll_after is not None and task.poll_after <= now:
                self._spawn(self._exclusive(task.id, self._poll(task.id)))
        if now - self._last_purge >= PURGE_EVERY_SECONDS:
            self._last_purge = now
            purged = await self._ledger.purge_expired()
            if purged:
                log.info("expired image tasks purged", extra={"count": purged})

    async def _scan_forever(self) -> None:
        while True:
            try:
                await self.scan_once()
            except TaskStoreError as exc:
                log.warning("image task scan failed: %s", exc.message)
            except Exception:
                log.exception("image task scan failed")
            # Jittered: replicas with equal intervals lock into one phase, and the one whose scan comes first
            # after a poll's due time would then make every poll (and each next one falls due in its phase).
            await asyncio.sleep(self._config.scan_interval_seconds * _jitter.uniform(0.8, 1.2))

    # -- submitting --------------------------------------------------------------------------------

    async def _submit_worker(self) -> None:
        while True:
            task_id = await self._queue.get()
            self._queued.discard(task_id)
            # In its own task, which `aclose` may let finish after this worker is cancelled.
            submit = asyncio.create_task(self._exclusive(task_id, self._submit(task_id)))
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
                await self._time_out(task_id)
                return
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
                            "image task submit lease lost during the upstream call", extra={"lease": lease.name}
                        )
                        return
                except TaskStoreError as exc:
                    log.warning("image task submit lease not renewed: %s", exc.message, extra={"lease": lease.name})

        renewal = asyncio.create_task(renew())
        try:
            yield
        finally:
            renewal.cancel()
            with suppress(asyncio.CancelledError):
                await renewal

    async def _submit_pending(self, task: Task, lease: Lease, leased_at: float) -> Task:
        """Submit `task` upstream under `lease` and record the outcome; the stored task afterwards."""
        callback = self._webhook_urls.url(task.id)
        try:
            async with self._quota.slot():  # its wait may outlast a lease: checked once a slot is free
                current = await self._holding(task, lease, leased_at)
                if current is None or current.state != TaskState.PENDING or _not_due(current, self._ledger.clock()):
                    return current or task
                task = current
                self._at_upstream.add(asyncio.current_task())  # type: ignore[arg-type]  # always in a task
                async with self._renewing(lease):
                    submission = await self._upstream.submit(task.arguments, callback)
        except (InvalidRequestError, NotFoundError) as exc:
            metrics.VIDEO_UPSTREAM_SUBMITS.labels(result="rejected").inc()
            reason = exc.message
            stored, _ = await self._ledger.change(
                task.id, lambda t: self._ledger.failed(t, "upstream_rejected", reason), known=task
            )
            return stored
        except GatewayError as exc:  # unavailable, timeout, quota, 5xx: try again later, until the deadline
            metrics.VIDEO_UPSTREAM_SUBMITS.labels(result="retry").inc()
            log.warning("image task submit failed, will retry: %s", exc.message, extra={"task_id": task.id})
            stored, _ = await self._ledger.change(task.id, self._retry_later, known=task)
            return stored
        metrics.VIDEO_UPSTREAM_SUBMITS.labels(result="accepted").inc()
        now = self._ledger.clock()
        wait = self._config.callback_grace_seconds if callback else self._config.poll_initial_seconds
        try:
            stored, _ = await self._ledger.change(
                task.id, lambda t: self._accepted(t, submission, now, wait), known=task
            )
        except BaseException:
            stop = asyncio.get_running_loop().create_task(self._stop_if_untracked(task.id, submission))
            self._stops.add(stop)
            stop.add_done_callback(self._stops.discard)
            raise
        if stored.upstream_request_id != submission.request_id:
            # The task ended while this job was being submitted (cancel, timeout, or the webhook of an
            # earlier submission): nobody tracks this job, so stop it.
            self._spawn(self._cancel_upstream(task.id, submission.cancel_url))
        return stored

    def _accepted(self, task: Task, submission: FalSubmission, now: float, wait: float) -> Task | None:
        if task.state != TaskState.PENDING:
            return None  # cancelled, timed out, or already ended by an early webhook
        return task.moved(
            TaskState.PROCESSING,
            now,
            upstream_request_id=submission.request_id,
            status_url=submission.status_url,
            response_url=submission.response_url,
            cancel_url=submission.cancel_url,
            submitted_at=now,
            submit_attempts=task.submit_attempts + 1,
            next_attempt_at=None,
            poll_after=now + wait,
        )

    def _retry_later(self, task: Task) -> Task | None:
        if task.state != TaskState.PENDING:
            return None
        now = self._ledger.clock()
        delay = backoff(self._config.retry_initial_seconds, self._config.retry_max_seconds, task.submit_attempts)
        return task.moved(TaskState.PENDING, now, submit_attempts=task.submit_attempts + 1, next_attempt_at=now + delay)

    # -- polling -----------------------------------------------------------------------------------

    async def _poll(self, task_id: str) -> None:
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
        log.warning("image task poll failed: %s", exc.message, extra={"task_id": task.id})
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

    # -- timeouts, cancels, housekeeping -----------------------------------------------------------

    async def _time_out(self, task_id: str) -> None:
        def decide(task: Task) -> Task | None:
            if task.state.terminal or self._ledger.clock() < task.deadline_at:
                return None
            seconds = task.deadline_at - task.created_at
            return self._ledger.failed(task, "timeout", f"the task did not finish within {seconds:g} s")

        task, changed = await self._ledger.change(task_id, decide)
        if changed:
            self.cancel_upstream(task)

    async def _stop_if_untracked(self, task_id: str, submission: FalSubmission) -> None:
        """The record of an accepted submission failed (store down, or cut off): the task stays pending and is
        submitted again, and nobody would track this job; stop it, unless the record was written after all."""
        with suppress(GatewayError):
            if (await self._ledger.get(task_id)).upstream_request_id == submission.request_id:
                return
        await self._cancel_upstream(task_id, submission.cancel_url)

    async def _cancel_upstream(self, task_id: str, cancel_url: str) -> None:
        try:
            await self._upstream.cancel(cancel_url)
        except GatewayError as exc:
            log.warning("upstream cancel failed: %s", exc.message, extra={"task_id": task_id})

    async def _exclusive(self, task_id: str, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` unless this replica is already busy with the task; errors are logged, not raised."""
        if task_id in self._busy:
            work.close()
            return
        self._busy.add(task_id)
        try:
            await work
        except GatewayError as exc:
            log.warning("image task step failed: %s", exc.message, extra={"task_id": task_id})
        except Exception:
            log.exception("image task step failed", extra={"task_id": task_id})
        finally:
            self._busy.discard(task_id)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
