"""Two real Tritons behind one TRITON_URL: a graceful stop or a kill of one fails no call, the stopping one gets no
calls until it is ready again, each outage is logged once, and a failed call finds a replacement address at once."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.settings import TritonSettings
from gateway.upstreams.triton import TritonClient
from localtriton.server import TritonProcess
from tests.helpers.conditions import until

pytestmark = pytest.mark.slow

WORKERS = 6  # concurrent callers, each sending unique single texts back to back


@pytest.fixture(scope="module")
def started_tritons(
    minilm_repository: Path, triton_factory: Callable[[Path], TritonProcess]
) -> tuple[TritonProcess, TritonProcess]:
    return triton_factory(minilm_repository), triton_factory(minilm_repository)


@pytest.fixture
def two_tritons(started_tritons: tuple[TritonProcess, TritonProcess]) -> tuple[TritonProcess, TritonProcess]:
    """Both running (a test that failed half-way may have left one stopped)."""
    for triton in started_tritons:
        if triton.pid is None:
            triton.start()
            triton.wait_ready(180)
    return started_tritons


class Load:
    """Callers embedding unique texts until stopped; every failure is kept."""

    def __init__(self, client: TritonClient) -> None:
        self.client = client
        self.calls = 0
        self.failures: list[str] = []
        self._running = True
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Load:
        self._tasks = [asyncio.create_task(self._worker(n)) for n in range(WORKERS)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._running = False
        await asyncio.gather(*self._tasks)

    async def _worker(self, n: int) -> None:
        while self._running:
            self.calls += 1
            try:
                result = await self.client.embed([f"worker {n} call {self.calls}"])
                assert result.vectors.shape[0] == 1
            except Exception as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.005)


def outage_logs(caplog: pytest.LogCaptureFixture, address: str) -> tuple[int, int]:
    records = [r for r in caplog.records if r.name == "gateway.upstreams.triton" and address in r.getMessage()]
    warnings = sum(r.levelno == logging.WARNING and "unavailable" in r.getMessage() for r in records)
    recoveries = sum(r.levelno == logging.INFO and "available again" in r.getMessage() for r in records)
    return warnings, recoveries


def kill_container(triton: TritonProcess) -> None:
    """SIGKILL Triton and its python-backend stubs at once, as a container's end kills them (the stubs of a killed
    server would otherwise live on, orphaned)."""
    pid = triton.pid
    assert pid is not None
    stubs = [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    for process in (pid, *stubs):
        os.kill(process, signal.SIGKILL)
    triton.stop()  # reaps it


async def restart(triton: TritonProcess) -> None:
    await asyncio.to_thread(triton.start)
    await asyncio.to_thread(triton.wait_ready, 180)


async def test_a_graceful_stop_and_a_kill_of_one_of_two_tritons_fail_no_call(
    two_tritons: tuple[TritonProcess, TritonProcess], caplog: pytest.LogCaptureFixture
) -> None:
    first, second = two_tritons
    caplog.set_level(logging.INFO, logger="gateway.upstreams.triton")

    settings = TritonSettings(url=f"ipv4:{first.grpc_url},{second.grpc_url}", timeout_seconds=10)
    async with TritonClient(settings) as client, Load(client) as load:
        await until(lambda: load.calls > 50, 60, "the load started")

        # A graceful stop: Triton keeps its port open while it drains and answers "stopping" meanwhile.
        stopping = asyncio.create_task(asyncio.to_thread(first.stop))
        await until(lambda: outage_logs(caplog, first.grpc_url)[0] == 1, 15, "the stopping Triton left rotation")
        before = load.calls
        await stopping
        await until(lambda: load.calls > before + 50, 30, "calls went on on the other Triton")
        await restart(first)
        await until(lambda: outage_logs(caplog, first.grpc_url) == (1, 1), 15, "back in rotation once ready")

        # A kill: the calls in flight on it fail mid-call and go to the other Triton.
        kill_container(second)
        before = load.calls
        await until(lambda: load.calls > before + 50, 30, "calls went on on the surviving Triton")
        await restart(second)
        await until(lambda: outage_logs(caplog, second.grpc_url) == (1, 1), 15, "back in rotation once ready")
        assert client.open_channels == 2, "one channel per Triton"

    assert load.failures == [], f"{len(load.failures)} of {load.calls} calls failed: {load.failures[:3]}"
    assert outage_logs(caplog, first.grpc_url) == (1, 1), "one WARNING and one INFO per outage"
    assert outage_logs(caplog, second.grpc_url) == (1, 1)


async def test_a_failed_call_resolves_the_name_again_and_goes_to_the_replacement_at_once(
    two_tritons: tuple[TritonProcess, TritonProcess],
) -> None:
    """A rollout replaces a pod by one at a new address: the name's next resolution gives it, and the call that
    found the old pod gone is made on the new one (no wait for the periodic resolution)."""
    old, new = two_tritons
    answers = {"now": [old.grpc_url]}
    lookups: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:  # the cluster's DNS for the headless Service
        lookups.append(host)
        return answers["now"]

    settings = TritonSettings(url="dns:///triton.example:8001", channel_max_age_seconds=3600, timeout_seconds=10)
    async with TritonClient(settings, resolve=resolve) as client:
        assert (await client.embed(["before the rollout"])).vectors.shape[0] == 1
        assert lookups == ["triton.example"]
        answers["now"] = [new.grpc_url]
        await asyncio.to_thread(old.stop)
        assert (await client.embed(["during the rollout"])).vectors.shape[0] == 1, "made on the replacement"
        assert len(lookups) == 2, "resolved again when the call failed"
        assert client.open_channels == 1, "the old address's channel closed"
    await restart(old)
