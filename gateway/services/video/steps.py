"""What the parts of the video task runner share: one step at a time per task on this replica, the
background steps that closing stops, and the back-off between tries.

A task may be handed to a step from several places on one replica (the scanner, the submit queue, a
cancel); the leases in the store keep other replicas out, and `TaskSteps` keeps this replica from racing
with itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from gateway.errors import GatewayError

log = logging.getLogger(__name__)


def backoff(first: float, most: float, attempt: int) -> float:
    """The wait before try `attempt + 1`: doubling from `first`, at most `most`."""
    return float(min(most, first * 2 ** min(attempt, 30)))


@dataclass(frozen=True)
class RunnerConfig:
    """How a replica works its video tasks: leases, submit workers, and the back-offs of retries and polls."""

    callback_grace_seconds: float = 30.0
    poll_initial_seconds: float = 1.0
    poll_max_seconds: float = 10.0
    lease_seconds: float = 30.0
    scan_interval_seconds: float = 1.0
    max_concurrent_submits: int = 4
    retry_initial_seconds: float = 1.0
    retry_max_seconds: float = 30.0
    # A task whose submit call was cut off (crash, timeout) waits this long for the job's webhook, or its entry in
    # fal's request history, before it is submitted again; 0 with neither, where nothing can reveal the job.
    unknown_submit_wait_seconds: float = 0.0
    lost_job_lookup_seconds: float = 10.0  # between lookups in the history meanwhile
    submit_call_seconds: float = 35.0  # the longest one submit call takes (connect and read deadlines)


class TaskSteps:
    def __init__(self) -> None:
        self._busy: set[str] = set()  # tasks this replica is submitting, polling or timing out right now
        self._background: set[asyncio.Task[None]] = set()

    def busy(self, task_id: str) -> bool:
        return task_id in self._busy

    async def exclusive(self, task_id: str, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` unless this replica is already busy with the task; errors are logged, not raised."""
        if task_id in self._busy:
            work.close()
            return
        self._busy.add(task_id)
        try:
            await work
        except GatewayError as exc:
            log.warning("video task step failed: %s", exc.message, extra={"task_id": task_id})
        except Exception:
            log.exception("video task step failed", extra={"task_id": task_id})
        finally:
            self._busy.discard(task_id)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in the background until it ends or `aclose` cancels it."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def aclose(self) -> None:
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
