"""`TaskScanner`: the one scan loop under the video tasks and the re-index jobs.

Every replica scans its task store for due work every `interval_seconds`, jittered (replicas started together
would otherwise scan, and race for leases, in step). A scan that fails, whatever it raised, is counted and left
to the next one: an exception let out of the loop would end the scans, and with them every task, until a
restart. A `GatewayError` (the task store or another dependency did not answer) is logged when such failures
start, any other exception (a bug) with its traceback; repeats of the same kind go to DEBUG. What a scan does
with a due task (claim it under a lease, submit, poll, run a job) is the caller's `scan_once`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from prometheus_client import Counter

from gateway.background import cancel_and_wait
from gateway.errors import GatewayError

log = logging.getLogger(__name__)

_jitter = random.Random()  # not the global generator, whose state belongs to the host program (and its tests)


class TaskScanner:
    def __init__(
        self,
        name: str,
        scan_once: Callable[[], Awaitable[object]],
        interval_seconds: float,
        failures: Counter,
        *,
        outages_logged_elsewhere: bool = False,
    ) -> None:
        """`failures` is counted by `reason`: store (a `GatewayError`) | internal (anything else).
        `outages_logged_elsewhere`: the store's outages are logged by its client (the Redis circuit), so a
        failing scan logs them at DEBUG only."""
        self.name = name
        self._scan_once = scan_once
        self._interval = interval_seconds
        self._failures = failures
        self._quiet_outages = outages_logged_elsewhere
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._scan_forever(), name=f"{self.name} scanner")

    async def aclose(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task, name=f"{self.name} scanner")

    async def _scan_forever(self) -> None:
        failing: str | None = None  # the kind of failure going on, logged when it starts
        while True:
            try:
                await self._scan_once()
                failing = None
            except GatewayError as exc:
                self._failures.labels(reason="store").inc()
                quiet = failing == "store" or self._quiet_outages
                log.log(logging.DEBUG if quiet else logging.WARNING, "%s scan failed: %s", self.name, exc)
                failing = "store"
            except Exception:
                self._failures.labels(reason="internal").inc()
                if failing == "internal":
                    log.debug("%s scan failed again", self.name, exc_info=True)
                else:
                    log.exception("%s scan failed; retrying at each scan", self.name)
                failing = "internal"
            await asyncio.sleep(self._interval * _jitter.uniform(0.8, 1.2))
