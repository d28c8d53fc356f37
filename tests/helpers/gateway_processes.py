"""Real `python -m gateway` processes on free ports for tests that kill and restart them, or run several replicas,
and the calls those tests make on them. Each process's output goes to a log file (the test keeps no handle on it
open); `Gateways.tails()` belongs in every assertion message. `Gateways.stop_all()` stops them as a deployment
would (SIGTERM) and fails the test, with the log tails, when one does not exit in time. The simulators the
gateways call run in the test's process, so tests read what the upstream saw.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localtriton.ports import free_port
from tests.helpers.checkout import ROOT
from tests.helpers.pika_fixtures import RunningPikaSimulator

KEY = "fal-key-secret"
NO_TRITON = "127.0.0.1:9"  # video tasks do not need Triton
FINAL = ("completed", "failed", "cancelled")
# Settings a developer's shell may hold; the gateways get only what each test gives them.
ENV_PREFIXES = ("GATEWAY_", "VIDEO_", "TASKS_", "TRITON_", "CHAT_", "CHAT_", "EMBEDDING_", "REDIS_", "OTEL_")


class GatewayProcess:
    """One `python -m gateway`, its output in `log_path`; `start` again after `kill` for a restart."""

    def __init__(self, name: str, env: dict[str, str], http_port: int, log_path: Path) -> None:
        self.name = name
        self.env = env
        self.http_port = http_port
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self, timeout: float = 60.0) -> GatewayProcess:
        """Start the process and wait until /healthz answers 200 (the lifespan, runner included, is up)."""
        return self.launch().wait_healthy(timeout)

    def launch(self) -> GatewayProcess:
        with self.log_path.open("ab") as log:  # the child keeps its own descriptor
            log.write(f"---- {self.name} started ----\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gateway"], cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def wait_healthy(self, timeout: float = 60.0) -> GatewayProcess:
        assert self.process is not None, f"gateway {self.name} was not launched"
        deadline = time.monotonic() + timeout
        while True:
            code = self.process.poll()
            assert code is None, f"gateway {self.name} exited with {code} while starting\n{self.tail()}"
            try:
                if httpx.get(f"{self.base_url}/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (
                f"gateway {self.name}: /healthz not 200 after {timeout} s\n{self.tail()}"
            )
            time.sleep(0.1)

    def terminate(self) -> None:
        """SIGTERM, as Kubernetes stops a pod: the gateway shuts down on its own."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()

    def wait_stopped(self, timeout: float) -> str | None:
        """Wait for the process to exit; one still running after `timeout` is killed, and the reason is returned
        (with its log tail) for the test to fail with."""
        if self.process is None:
            return None
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
            return f"gateway {self.name} did not exit within {timeout} s of SIGTERM and was killed\n{self.tail()}"
        return None

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, leases and in-flight work are left as they are."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait(timeout=10)

    def tail(self, lines: int = 25) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"-- last {lines} lines of {self.name} ({self.log_path}) --\n" + "\n".join(text.splitlines()[-lines:])


class Gateways:
    """The gateway processes of one test; every one is killed at teardown."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[GatewayProcess] = []

    def create(self, name: str, http_port: int, variables: dict[str, str]) -> GatewayProcess:
        env = {key: value for key, value in os.environ.items() if not key.startswith(ENV_PREFIXES)}
        env.update(
            {
                "GATEWAY_HOST": "127.0.0.1",
                "GATEWAY_HTTP_PORT": str(http_port),
                "GATEWAY_GRPC_PORT": str(free_port()),
                "TRITON_URL": NO_TRITON,
                "EMBEDDING_CACHE_MB": "0",
                "CHAT_CACHE_MB": "0",
                # A spool of its own: no record of another test's is replayed into this one's Redis.
                "GATEWAY_USAGE_SPOOL_PATH": str(self.directory / f"usage-spool-{name}.sqlite3"),
                **variables,
            }
        )
        gateway = GatewayProcess(name, env, http_port, self.directory / f"gateway-{name}.log")
        self.started.append(gateway)
        return gateway

    def tails(self) -> str:
        return "\n".join(gateway.tail() for gateway in self.started)

    def stop_all(self, timeout: float = 30.0) -> None:
        """SIGTERM to all, then wait for each; fails the test (after all are gone) if any had to be killed."""
        for gateway in self.started:
            gateway.terminate()
        stuck = [reason for gateway in self.started if (reason := gateway.wait_stopped(timeout)) is not None]
        if stuck:
            pytest.fail("\n".join(stuck))

    def kill_all(self) -> None:
        for gateway in self.started:
            gateway.kill()


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[Gateways]:
    """The gateway processes of a test; all are killed at teardown."""
    processes = Gateways(tmp_path)
    try:
        yield processes
    finally:
        processes.kill_all()


def pika_variables(simulator: RunningPikaSimulator, **overrides: str) -> dict[str, str]:
    simulator.config.api_key = KEY
    return {
        "VIDEO_API_KEY": KEY,
        "VIDEO_BASE_URL": simulator.base_url,
        "VIDEO_WEBHOOK_JWKS_URL": simulator.jwks_url,
        "VIDEO_PLATFORM_URL": simulator.base_url,  # fal's request history, served beside the queue
        **overrides,
    }


def submit(http: httpx.Client, gateway: GatewayProcess, prompt: str, diagnostics: Callable[[], str]) -> str:
    answer = http.post(f"{gateway.base_url}/v1/images/generations", json={"prompt": prompt})
    assert answer.status_code == 202, f"{answer.status_code} {answer.text}\n{diagnostics()}"
    task_id: str = answer.json()["id"]
    return task_id


def statuses(http: httpx.Client, gateway: GatewayProcess, task_ids: list[str]) -> dict[str, dict[str, Any]]:
    tasks: dict[str, dict[str, Any]] = {}
    for task_id in task_ids:
        answer = http.get(f"{gateway.base_url}/v1/tasks/{task_id}")
        assert answer.status_code == 200, f"GET task {task_id}: {answer.status_code} {answer.text}"
        tasks[task_id] = answer.json()
    return tasks


def wait_all_final(
    http: httpx.Client,
    gateway: GatewayProcess,
    task_ids: list[str],
    timeout: float,
    diagnostics: Callable[[], str],
) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        tasks = statuses(http, gateway, task_ids)
        counts = Counter(task["status"] for task in tasks.values())
        if all(task["status"] in FINAL for task in tasks.values()):
            return tasks
        assert time.monotonic() < deadline, f"not all tasks ended within {timeout} s: {dict(counts)}\n{diagnostics()}"
        time.sleep(0.2)
