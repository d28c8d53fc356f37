"""Stopping the process's background tasks (refresh loops, scanners, listeners) when it shuts down."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)
RECANCEL_SECONDS = 0.1


async def cancel_and_wait(*tasks: asyncio.Task[Any], name: str, deadline_seconds: float = 5.0) -> None:
    """Cancel `tasks` and wait for them to end, cancelling again until they do.

    One cancel is not always enough: a cancellation that lands in a client library at the moment its own
    deadline fires can come out as that library's timeout error, which a loop built to survive errors
    catches and carries on. The next cancel lands in the loop's sleep. Tasks still running after
    `deadline_seconds` are logged and left, so a shutdown never waits on them for ever.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_seconds
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_SECONDS)
        if pending and loop.time() >= deadline:
            log.error(
                "%s: %d background task(s) did not stop within %.0f s; left running",
                name,
                len(pending),
                deadline_seconds,
            )
            return
    await asyncio.gather(*tasks, return_exceptions=True)  # their outcomes are retrieved, not logged as lost
