"""A real Milvus protocol endpoint for the tests: Milvus Lite's gRPC server (`python -m milvus_lite server`) on
a free port, speaking the protocol a Milvus cluster speaks to pymilvus."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localtriton.ports import free_port


class MilvusLiteServer:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> MilvusLiteServer:
        command = [
            sys.executable, "-m", "milvus_lite", "server",
            "--data-dir", str(self.directory / "data"), "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip
        with (self.directory / "milvus.log").open("ab") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"milvus_lite server exited; see {self.directory / 'milvus.log'}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"milvus_lite server did not listen on {self.port} within {timeout} s")

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None


@pytest.fixture(scope="session")
def milvus_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MilvusLiteServer]:
    server = MilvusLiteServer(tmp_path_factory.mktemp("milvus")).start()
    yield server
    server.stop()
