"""SingleFlight: one call per key for concurrent requests; cancelled with its last waiter only when asked."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from gateway.services.single_flight import SingleFlight


class Upstream:
    """Calls that each wait for `release()`, then answer their number or raise; records how they ended."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.started = 0
        self.ended: list[str] = []  # "done", "failed" or "cancelled", per call
        self._release = asyncio.Event()

    def release(self) -> None:
        self._release.set()

    async def call(self) -> int:
        self.started += 1
        number = self.started
        try:
            await self._release.wait()
        except asyncio.CancelledError:
            self.ended.append("cancelled")
            raise
        if self.fail:
            self.ended.append("failed")
            raise RuntimeError(f"call {number} failed")
        self.ended.append("done")
        return number


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def unretrieved_errors(loop: asyncio.AbstractEventLoop) -> list[dict[str, Any]]:
    """What the loop's exception handler receives from here on (e.g. "Task exception was never retrieved")."""
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    return reported


async def test_concurrent_requests_for_a_key_share_one_call_and_a_later_one_starts_another() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    upstream = Upstream()
    requests = [asyncio.ensure_future(flights.run("k", upstream.call)) for _ in range(3)]
    await settle()
    other = asyncio.ensure_future(flights.run("other", upstream.call))
    await settle()
    upstream.release()
    assert await asyncio.gather(*requests) == [1, 1, 1]
    assert await other == 2
    assert flights.running("k") is None
    assert await flights.run("k", upstream.call) == 3


async def test_one_call_answers_every_key_it_was_started_for_until_it_ends() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    upstream = Upstream()
    task = flights.start(["a", "b"], upstream.call())
    assert flights.running("a") is task and flights.running("b") is task and flights.running("c") is None
    upstream.release()
    assert await flights.wait(task) == 1
    await settle()
    assert flights.running("a") is None and flights.running("b") is None


async def test_without_cancel_when_abandoned_the_call_outlives_every_waiter() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    upstream = Upstream()
    task = flights.start(["k"], upstream.call())
    leaving, staying = (asyncio.ensure_future(flights.wait(task)) for _ in range(2))
    await settle()
    leaving.cancel()
    staying.cancel()
    await settle()
    assert flights.running("k") is task  # still shared with whoever asks for "k" meanwhile
    joining = asyncio.ensure_future(flights.run("k", upstream.call))
    upstream.release()
    assert await joining == 1
    assert upstream.started == 1 and upstream.ended == ["done"]


async def test_with_cancel_when_abandoned_the_last_waiter_leaving_cancels_the_call() -> None:
    flights: SingleFlight[str, int] = SingleFlight(cancel_when_abandoned=True)
    upstream = Upstream()
    first, second = (asyncio.ensure_future(flights.run("k", upstream.call)) for _ in range(2))
    await settle()
    first.cancel()
    await settle()
    assert upstream.ended == []  # one waiter is left
    second.cancel()
    await asyncio.sleep(0)  # the last waiter's clean-up has run; the call's cancellation has not yet
    assert flights.running("k") is None  # so a request arriving now starts its own call
    late = asyncio.ensure_future(flights.run("k", upstream.call))
    await settle()
    assert upstream.ended == ["cancelled"]
    upstream.release()
    assert await late == 2


async def test_a_finished_call_is_not_cancelled_when_its_waiters_leave() -> None:
    flights: SingleFlight[str, int] = SingleFlight(cancel_when_abandoned=True)
    upstream = Upstream()
    upstream.release()
    assert await flights.run("k", upstream.call) == 1
    assert upstream.ended == ["done"]


@pytest.mark.parametrize("cancel_when_abandoned", [False, True])
async def test_every_waiter_gets_the_error_and_nothing_is_logged_as_never_retrieved(
    cancel_when_abandoned: bool,
) -> None:
    reported = unretrieved_errors(asyncio.get_running_loop())
    flights: SingleFlight[str, int] = SingleFlight(cancel_when_abandoned=cancel_when_abandoned)
    upstream = Upstream(fail=True)
    requests = [asyncio.ensure_future(flights.run("k", upstream.call)) for _ in range(2)]
    await settle()
    upstream.release()
    for request in requests:
        with pytest.raises(RuntimeError, match="call 1 failed"):
            await request
    del requests
    gc.collect()
    assert reported == []


async def test_a_call_failing_after_its_only_waiter_left_logs_nothing() -> None:
    reported = unretrieved_errors(asyncio.get_running_loop())
    flights: SingleFlight[str, int] = SingleFlight()
    upstream = Upstream(fail=True)
    request = asyncio.ensure_future(flights.run("k", upstream.call))
    await settle()
    request.cancel()
    await settle()
    upstream.release()
    await settle()
    assert upstream.ended == ["failed"] and flights.running("k") is None
    del request
    gc.collect()
    assert reported == []
