"""Real Milvus for the tests: Milvus standalone 2.3.5 (the `milvus` package's `milvus-server`, with embedded etcd,
RocksMQ and local storage) in a temp folder, every port a free one, stopped at the end of the session.

It is the engine a deployment runs (time ticks, growing and sealed segments, index builds, consistency levels),
which Milvus Lite, an engine of its own that merely speaks the protocol, is not. The package's binaries come
xz-compressed; they are unpacked once into pytest's cache folder (7 s here) and linked into each server's folder.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from localtriton.ports import free_port

VERSION = "2.3.5"
# milvus-server's port options; the embedded etcd's peer port is not among them (etcd.yaml below sets it).
PORTS = (
    "proxy-port", "proxy-internal-port", "etcd-port", "root-coord-port", "query-coord-port", "query-node-port",
    "index-coord-port", "index-node-port", "data-coord-port", "data-node-port",
)  # fmt: skip


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
        self.ports = {name: free_port() for name in PORTS}
        self.etcd_peer_port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.ports['proxy-port']}"

    @property
    def log(self) -> Path:
        return self.directory / "milvus-server.log"

    def start(self, timeout: float = 120.0) -> MilvusStandalone:
        (self.directory / "bin").symlink_to(self.binaries, target_is_directory=True)
        etcd = self.directory / "etcd.yaml"  # etcd's defaults would take 2379/2380 whatever etcd-port says
        client, peer = f"http://127.0.0.1:{self.ports['etcd-port']}", f"http://127.0.0.1:{self.etcd_peer_port}"
        etcd.write_text(
            f"listen-client-urls: {client}\nadvertise-client-urls: {client}\nlisten-peer-urls: {peer}\n"
            f"initial-advertise-peer-urls: {peer}\ninitial-cluster: default={peer}\n"
        )
        command = [str(Path(sys.executable).with_name("milvus-server")), "--data", str(self.directory)]
        for name, port in self.ports.items():
            command += [f"--{name}", str(port)]
        environment = {**os.environ, "ETCD_CONFIG_PATH": str(etcd), "PYTHONUNBUFFERED": "1"}
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"milvus-server exited; see {self.log} and {self.directory / 'logs'}")
            if "Started:" in self.log.read_text(errors="replace"):  # printed once /healthz answered OK
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


@pytest.fixture(scope="session")
def milvus_server(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[MilvusStandalone]:
    cache = getattr(pytestconfig, "cache", None)  # None under `-p no:cacheprovider`: unpack into this session's
    folder = cache.mkdir(f"milvus-standalone-{VERSION}") if cache is not None else tmp_path_factory.mktemp("bin")
    binaries = unpacked_binaries(folder)
    server = MilvusStandalone(tmp_path_factory.mktemp("milvus"), binaries).start()
    yield server
    server.stop()
