"""The background side of video tasks: a scanner that hands due tasks to the submitter, the poller and the
reaper (`video/submitter.py`, `video/poller.py`, `video/reaper.py`), all around one `TaskLedger`.

Each replica runs one `VideoTaskRunner`. Its scanner reads the unfinished tasks that are due (`Task.due_at`)
from the store every `scan_interval_seconds`, so a task survives any replica: a restarted or surviving replica finds it
still pending (and submits it) or processing (and polls it once its webhook is overdue). Submitting
and polling a task each take a short lease in the store first, so one replica at a time does it;
the time of the next attempt or poll is kept on the task, so the back-off continues wherever the
task goes next. New tasks are also queued locally, so the replica that accepted one submits it at once,
under the submit lease it took with the task (`VideoSubmitter.enqueue_created`).
"""

from __future__ import annotations

import logging
from typing import Protocol

from gateway import metrics
from gateway.quota.base import QuotaLimiter
from gateway.services.video.ledger import TaskLedger
from gateway.services.video.lost_jobs import CLOCK_SLACK_SECONDS, LostJobFinder, RequestHistory
from gateway.services.video.poller import StatusQueue, VideoPoller
from gateway.services.video.reaper import CancelQueue, VideoReaper
from gateway.services.video.steps import RunnerConfig, TaskSteps
from gateway.services.video.submitter import SUBMIT_DRAIN_SECONDS, SubmitQueue, VideoSubmitter
from gateway.tasks.model import TaskState
from gateway.tasks.scanner import TaskScanner
from gateway.upstreams.webhooks import WebhookUrls

log = logging.getLogger(__name__)

MAX_DUE_PER_SCAN = 500  # the earliest due first; the rest wait for the next scan


class VideoQueue(SubmitQueue, StatusQueue, CancelQueue, Protocol):
    """What the runner needs from the upstream client (`FalQueueClient`)."""


class VideoTaskRunner:
    def __init__(
        self,
        ledger: TaskLedger,
        upstream: VideoQueue,
        quota: QuotaLimiter,
        webhook_urls: WebhookUrls,
        config: RunnerConfig,
        *,
        owner: str,
        history: RequestHistory | None = None,
    ) -> None:
        """`history`: fal's request history, where the job of a submit whose answer was lost can be found
        (`LostJobFinder`); None: only its webhook can name it."""
        self._ledger = ledger
        self._steps = TaskSteps()
        self.reaper = VideoReaper(ledger, upstream, self._steps)
        self.submitter = VideoSubmitter(
            ledger,
            upstream,
            quota,
            webhook_urls,
            self._steps,
            self.reaper,
            config,
            LostJobFinder(
                history,
                ledger,
                submit_call_seconds=config.submit_call_seconds,
                # Past every lookup that may match the job: those of attempts begun within a call's time of it.
                claim_seconds=config.unknown_submit_wait_seconds
                + config.submit_call_seconds
                + config.lease_seconds
                + 2 * CLOCK_SLACK_SECONDS,
            ),
            owner=owner,
        )
        self.poller = VideoPoller(ledger, upstream, config, owner=owner)
        # Jittered: replicas with equal intervals would lock into one phase, and the one whose scan comes first
        # after a poll's due time would then make every poll (and each next one falls due in its phase).
        self._scanner = TaskScanner(
            "video task", self.scan_once, config.scan_interval_seconds, metrics.VIDEO_SCAN_FAILURES
        )

    async def start(self) -> None:
        self.submitter.start()
        self._scanner.start()

    async def aclose(self, drain_seconds: float = SUBMIT_DRAIN_SECONDS) -> None:
        """Stop scanning, let submits at the upstream record their outcome (`VideoSubmitter.aclose`), stop the
        background steps, and give the stops of untracked jobs their time (`VideoReaper.aclose`)."""
        await self._scanner.aclose()
        await self.submitter.aclose(drain_seconds)
        await self._steps.aclose()
        await self.reaper.aclose(drain_seconds)

    async def scan_once(self) -> None:
        now = self._ledger.clock()
        counts = await self._ledger.count_unfinished()
        for state in (TaskState.PENDING, TaskState.PROCESSING):
            metrics.VIDEO_TASKS.labels(state=state.value).set(counts.get(state, 0))
        # Only the tasks due by now, from the store's index: the scan costs what is due, not what is open.
        for task in await self._ledger.due(now, MAX_DUE_PER_SCAN):
            if self._steps.busy(task.id):
                continue
            if now >= task.deadline_at:
                self._steps.spawn(self._steps.exclusive(task.id, self.reaper.time_out(task.id)))
            elif task.state == TaskState.PENDING and (task.next_attempt_at or 0.0) <= now:
                self.submitter.enqueue(task.id)
            elif task.state == TaskState.PROCESSING and task.poll_after is not None and task.poll_after <= now:
                self._steps.spawn(self._steps.exclusive(task.id, self.poller.poll(task.id)))
        await self.reaper.purge_if_due(now)
