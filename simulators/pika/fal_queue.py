"""The simulated fal queue: the job table, each job's life from IN_QUEUE to its webhook, and the random faults
(rolled from one seeded generator, so a seed replays the same failures)."""

from __future__ import annotations

import asyncio
import copy
import random
import time
import uuid
from collections.abc import Coroutine
from typing import Any

from fastapi import Request

from simulators.pika.config import PikaSimulatorConfig
from simulators.pika.jobs import CANCELLED, COMPLETED, FAILED, IN_PROGRESS, IN_QUEUE, Job
from simulators.pika.stats import PikaSimulatorStats
from simulators.pika.webhooks import WebhookSender


class FalQueue:
    """The live config, the stats, the jobs and their running tasks of one simulator app."""

    def __init__(self, config: PikaSimulatorConfig) -> None:
        self.config = config
        self.stats = PikaSimulatorStats()
        self.jobs: dict[str, Job] = {}
        self.webhooks = WebhookSender(self.stats)
        self.tasks: set[asyncio.Task[None]] = set()
        self._seed = config.seed
        self._random = random.Random(config.seed)

    def roll(self, probability: float) -> bool:
        if self.config.seed != self._seed:
            self._seed, self._random = self.config.seed, random.Random(self.config.seed)
        return self._random.random() < probability

    def authorized(self, request: Request) -> bool:
        expected = self.config.api_key
        if expected is None or request.headers.get("authorization") == f"Key {expected}":
            return True
        self.stats.unauthorized += 1
        return False

    def submit(
        self, app_id: str, model_path: str, body: dict[str, Any], webhook_url: str | None, sent_at: float
    ) -> Job:
        """Queue a job (its submit came in at `sent_at`, Unix seconds), with its faults rolled from the config as
        it is now, and start its life."""
        config = copy.copy(self.config)
        will_fail = config.fail_next > 0 or self.roll(config.failure_rate)
        if self.config.fail_next > 0:
            self.config.fail_next -= 1
        job = Job(
            request_id=str(uuid.uuid4()),
            app_id=app_id,
            model_path=model_path,
            body=body,
            webhook_url=webhook_url,
            config=config,
            submitted_at=time.monotonic(),
            sent_at=sent_at,
            will_fail=will_fail,
            lose_callback=self.roll(config.callback_loss_rate),
        )
        self.jobs[job.request_id] = job
        self.stats.submitted += 1
        self.stats.submitted_by_model[job.model_path] += 1
        self.stats.submitted_by_prompt[str(body.get("prompt"))] += 1
        self.stats.jobs_by_state[IN_QUEUE] += 1
        self._spawn(self._run(job))
        return job

    def cancel(self, job: Job) -> None:
        job.cancel_requested = True
        job.error = "request was cancelled"
        self._set_state(job, CANCELLED)

    def queue_position(self, job: Job) -> int:
        return sum(
            1 for other in self.jobs.values() if other.state == IN_QUEUE and other.submitted_at < job.submitted_at
        )

    async def stop(self) -> None:
        """Cancel the jobs still running and wait for them to end."""
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, job: Job) -> None:
        config = job.config
        queue_seconds = config.job_seconds * config.queue_fraction
        await asyncio.sleep(queue_seconds)
        if not job.ended:
            self._set_state(job, IN_PROGRESS)
        await asyncio.sleep(config.job_seconds - queue_seconds)
        if not job.ended:
            if job.will_fail:
                job.error = config.error_message
                self._set_state(job, FAILED)
            else:
                job.result = job.video_result()
                self._set_state(job, COMPLETED)
        await self.webhooks.deliver(job)

    def _set_state(self, job: Job, state: str) -> None:
        self.stats.jobs_by_state[job.state] -= 1
        self.stats.jobs_by_state[state] += 1
        job.state = state
        if state == IN_PROGRESS:
            job.started_at = time.time()
        elif job.ended:
            job.ended_at = time.time()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
