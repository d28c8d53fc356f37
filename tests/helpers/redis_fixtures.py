"""A real `redis-server` on a free port, for tests of the cache stores (a pytest plugin).

Tests may stop the server mid-test to check how the gateway degrades and start it
again on the same port; `redis_url` brings a stopped server back and empties it,
so every test starts from a running, empty Redis.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localtriton.ports import free_port


class RedisStartError(RuntimeError):
    """`redis-server` exited or did not answer PING in time."""


class RedisServer:
    """One `redis-server` process without persistence, listening on 127.0.0.1 only."""

    def __init__(self, directory: Path, port: int | None = None, executable: str = "redis-server") -> None:
        self.directory = directory
        self.port = port if port is not None else free_port()
        self.executable = executable
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 10.0) -> None:
        """Start the server (on the same port as before) and wait until it answers PING."""
        if self.running:
            return
        self._stop_process()  # reap a server that exited on its own
        path = shutil.which(self.executable)
        if path is None:
            raise RedisStartError(f"{self.executable} not found on PATH")
        command = [path, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        with (self.directory / "redis.log").open("ab") as log:  # the child keeps its own descriptor
            self._process = subprocess.Popen(command, cwd=self.directory, stdout=log, stderr=subprocess.STDOUT)
        self._wait_ready(timeout)

    def stop(self) -> None:
        """Stop the server; clients see refused connections until `start()`."""
        self._stop_process()

    def freeze(self) -> None:
        """SIGSTOP: the server keeps its port and accepts connections but answers nothing (a hung node)."""
        assert self._process is not None, "redis-server is not running"
        self._process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after `freeze()`: the server answers again, queued commands first."""
        assert self._process is not None, "redis-server is not running"
        self._process.send_signal(signal.SIGCONT)

    def command(self, *args: str) -> bytes:
        """Send one inline command (e.g. "FLUSHALL") and return the raw reply line."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2.0) as sock:
            sock.sendall(" ".join(args).encode() + b"\r\n")
            return _read_line(sock)

    def log_tail(self, lines: int = 20) -> str:
        log = self.directory / "redis.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise RedisStartError(f"redis-server exited with {self._process.returncode}\n{self.log_tail()}")
            try:
                if self.command("PING") == b"+PONG":
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise RedisStartError(f"redis-server not answering PING after {timeout:.0f} s\n{self.log_tail()}")

    def _stop_process(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.send_signal(signal.SIGCONT)  # a frozen server could not act on SIGTERM
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def _read_line(sock: socket.socket) -> bytes:
    reply = b""
    while not reply.endswith(b"\r\n"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        reply += chunk
    return reply.rstrip(b"\r\n")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One Redis for the whole session (stopped at its end)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The URL of a running, empty Redis (started again if an earlier test stopped it)."""
    redis_server.start()
    reply = redis_server.command("FLUSHALL")
    if reply != b"+OK":
        raise RedisStartError(f"FLUSHALL answered {reply!r}")
    return redis_server.url


@pytest.fixture
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A `redis-server` of the test's own, which it may freeze or stop (the session's one is never)."""
    server = RedisServer(tmp_path_factory.mktemp("own-redis"))
    server.start()
    yield server
    if server.running:
        server.thaw()  # a test that failed while it was frozen
    server.stop()
