"""Background tasks stop at shutdown even when a cancellation is lost on the way."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gateway.background import cancel_and_wait


async def survives_one_cancel(calls: list[str]) -> None:
    """A refresh loop whose call turns a cancellation into its own timeout error once, as a client library
    whose deadline fires at that moment does, and which carries on after errors."""
    swallowed = False
    while True:
        try:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed = True
                raise TimeoutError from None
        except TimeoutError:
            calls.append("timeout survived")
        await asyncio.sleep(0)  # the loop's own pause, where the next cancel lands


async def test_a_task_that_survives_one_cancel_is_stopped_by_the_next() -> None:
    calls: list[str] = []
    task = asyncio.ensure_future(survives_one_cancel(calls))
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task, name="refresh"), timeout=5)
    assert task.cancelled()
    assert calls == ["timeout survived"]


async def test_a_task_that_never_stops_is_left_after_the_deadline(caplog: pytest.LogCaptureFixture) -> None:
    released = False

    async def stubborn() -> None:
        while not released:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                continue

    caplog.set_level(logging.ERROR, logger="gateway.background")
    task = asyncio.ensure_future(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task, name="stubborn loop", deadline_seconds=0.3), timeout=5)
    done = task.done()
    released = True
    await task
    assert done is False
    assert "stubborn loop: 1 background task(s) did not stop within 0 s" in caplog.text
