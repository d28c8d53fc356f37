"""Servers as subprocesses: started in a session of their own, waited for on a URL, stopped on exit."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx

from bench.cpu import tree_cpu_seconds
from bench.paths import ROOT


class ServerProcess:
    """A server started as a subprocess (own session), waited for on a URL, stopped on exit."""

    def __init__(self, name: str, command: Sequence[str], *, env: dict[str, str] | None = None, log_dir: Path) -> None:
        self.name = name
        self.command = list(command)
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, ready: str | Callable[[], bool], *, timeout: float = 180.0) -> None:
        """Start it and wait until it is ready: the URL `ready` answers 200, or the check `ready` says so."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}; see {self.log_path}")
            if callable(ready):
                if ready():
                    return
            else:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(ready, timeout=2).status_code == 200:
                        return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} not ready ({ready}) after {timeout:.0f} s; see {self.log_path}")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.pid)

    def check_alive(self) -> None:
        """Raise if the server has exited: its errors must not be reported as a slow system's."""
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with {self.process.returncode} during the benchmark; see {self.log_path}"
            )

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@contextlib.contextmanager
def running(*servers: tuple[ServerProcess, str]) -> Iterator[None]:
    """Start each (server, ready URL) in order; stop them all (in reverse) on exit."""
    started: list[ServerProcess] = []
    with stopped_on_exit(started):
        for server, url in servers:
            server.start(url)
            started.append(server)
        yield


@contextlib.contextmanager
def stopped_on_exit(servers: list[ServerProcess]) -> Iterator[None]:
    """Stop every server in `servers` (in reverse) on exit, those appended meanwhile included."""
    try:
        yield
    finally:
        for server in reversed(servers):
            server.stop()
