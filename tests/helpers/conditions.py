"""Waiting for a condition to hold, with a deadline: what a test does in place of a sleep that guesses how long
another thread, process or task takes to get there."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], timeout: float = 10.0, what: str = "the condition") -> None:
    """Poll `condition` every 10 ms (blocking: for sync tests, and never on a loop that serves the test)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not met within {timeout} s"
        time.sleep(0.01)


async def until(
    condition: Callable[[], object], timeout: float = 10.0, what: str = "the condition", *, poll_seconds: float = 0.01
) -> None:
    """Poll `condition` every `poll_seconds` without blocking the event loop."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not met within {timeout} s"
        await asyncio.sleep(poll_seconds)
