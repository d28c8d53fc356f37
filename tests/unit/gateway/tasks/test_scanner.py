"""The one scan loop of video tasks and re-index jobs survives whatever a scan raises, counts each failure by
kind, and logs a kind of failure when it starts (a bug with its traceback), its repeats at DEBUG only."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import Counter

from gateway.errors import UpstreamUnavailableError
from gateway.tasks.scanner import TaskScanner

FAILURES = Counter("test_scan_failures_total", "Failed scans of the test.", ["reason"])


async def test_scans_go_on_after_any_exception_and_each_kind_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    outcomes: list[Exception | None] = [RuntimeError("bug"), RuntimeError("bug"), UpstreamUnavailableError("down"),
                                        UpstreamUnavailableError("down"), None]  # fmt: skip
    scanned = asyncio.Event()

    async def scan_once() -> None:
        outcome = outcomes.pop(0) if outcomes else None
        if outcome is not None:
            raise outcome
        scanned.set()

    before = {reason: FAILURES.labels(reason=reason)._value.get() for reason in ("internal", "store")}
    with caplog.at_level(logging.DEBUG, logger="gateway.tasks.scanner"):
        await scan_until(TaskScanner("test", scan_once, 0.001, FAILURES), scanned)
    assert FAILURES.labels(reason="internal")._value.get() == before["internal"] + 2
    assert FAILURES.labels(reason="store")._value.get() == before["store"] + 2
    logged = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert logged == [
        (logging.ERROR, "test scan failed; retrying at each scan"),
        (logging.DEBUG, "test scan failed again"),
        (logging.WARNING, "test scan failed: down"),
        (logging.DEBUG, "test scan failed: down"),
    ]
    assert caplog.records[0].exc_info is not None


async def test_store_outages_its_client_logs_stay_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    scanned = asyncio.Event()
    failed = False

    async def scan_once() -> None:
        nonlocal failed
        if not failed:
            failed = True
            raise UpstreamUnavailableError("redis down")
        scanned.set()

    with caplog.at_level(logging.DEBUG, logger="gateway.tasks.scanner"):
        await scan_until(TaskScanner("quiet", scan_once, 0.001, FAILURES, outages_logged_elsewhere=True), scanned)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.DEBUG, "quiet scan failed: redis down")]


async def scan_until(scanner: TaskScanner, scanned: asyncio.Event) -> None:
    """Run `scanner` until a scan has succeeded (`scanned` is set), then stop it."""
    scanner.start()
    try:
        await asyncio.wait_for(scanned.wait(), 10)
    finally:
        await scanner.aclose()
