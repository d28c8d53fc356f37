"""Run the real `tritonserver` binary that the `nvidia-pytriton` wheel ships.

The wheel keeps the server, its python backend and one backend stub per Python
version apart; `prepare_distribution` lays them out the way `tritonserver`
expects (the stub for *this* interpreter inside `backends/python`), once.
`TritonProcess` starts the server on a model repository, waits until it is
ready and stops it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 8001
DEFAULT_METRICS_PORT = 8002
# The python backend gives each model instance a shared-memory region for its tensors that grows
# (1 MiB by default) when a batch does not fit. Growing it under concurrent load is the path of a
# known abort (boost::interprocess::lock_exception, then SIGSEGV in the python backend; seen once in
# a benchmark here, reported upstream as triton-inference-server/server#8882), so start every
# region at a size a full batch fits in and grow in large steps.
PYTHON_BACKEND_SHM_ARGS = (
    "--backend-config=python,shm-default-byte-size=16777216",
    "--backend-config=python,shm-growth-byte-size=16777216",
)


class TritonStartError(RuntimeError):
    """The server exited or did not become ready in time."""


def _pytriton_paths() -> tuple[Path, Path, Path]:
    """(server distribution folder, shared libraries folder, stub for this Python).

    Found without importing `pytriton`, whose package imports its own client (gevent, zmq, tritonclient's HTTP
    client): the server needs none of them, and a machine given only the wheel's files (`pip install --target`,
    as the GPU check does on a machine without network) has none of them."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'pytriton': install nvidia-pytriton, which ships tritonserver")
    root = Path(next(iter(spec.submodule_search_locations)))
    # A wheel keeps the server's libraries beside the package, a source checkout (editable install) under it.
    libs = root.parent / "nvidia_pytriton.libs"
    if not libs.is_dir():
        libs = root / "tritonserver" / "external_libs"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    dist = root / "tritonserver"
    return dist, libs, dist / "python_backend_stubs" / version / "triton_python_backend_stub"


def prepare_distribution(dest: Path) -> Path:
    """Copy the server and the matching python backend stub to `dest`; return `dest`."""
    dist, _, stub = _pytriton_paths()
    marker = dest / "backends" / "python" / "triton_python_backend_stub"
    if marker.exists() and marker.stat().st_size == stub.stat().st_size:
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(dist, dest, ignore=shutil.ignore_patterns("python_backend_stubs", "__pycache__"))
    shutil.copy2(stub, marker)
    return dest


@dataclass
class TritonProcess:
    """One `tritonserver` process serving `repository` on the given ports."""

    repository: Path
    http_port: int = DEFAULT_HTTP_PORT
    grpc_port: int = DEFAULT_GRPC_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    host: str = "127.0.0.1"
    dist_dir: Path = Path(".run/tritonserver")
    log_path: Path | None = None
    exit_timeout_seconds: int = 30  # how long a stopping server waits for in-flight requests and connections
    extra_args: tuple[str, ...] = ()
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def command(self) -> list[str]:
        dist = prepare_distribution(self.dist_dir.resolve())
        return [
            str(dist / "bin" / "tritonserver"),
            f"--model-repository={self.repository.resolve()}",
            f"--backend-directory={dist / 'backends'}",
            f"--cache-directory={dist / 'caches'}",
            f"--http-address={self.host}",
            f"--http-port={self.http_port}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.metrics_port}",
            "--allow-gpu-metrics=false",
            "--strict-readiness=true",
            "--exit-on-error=true",
            f"--exit-timeout-secs={self.exit_timeout_seconds}",
            *PYTHON_BACKEND_SHM_ARGS,
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        """The server's environment.

        The python backend stub imports the models' packages from the first
        `python3` on PATH, so this interpreter's `bin` goes first.
        """
        _, libs, _ = _pytriton_paths()
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(libs), env.get("LD_LIBRARY_PATH")]))
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        return env

    def start(self, *, detach: bool = False) -> None:
        if self._process is not None:
            raise RuntimeError(f"tritonserver already running (pid {self._process.pid})")
        command, env = self.command(), self.environment()
        if self.log_path is None:
            self._process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, start_new_session=detach)
            return
        with self.log_path.open("ab") as log:  # the child keeps its own copy of the descriptor
            self._process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=detach
            )

    def wait_ready(self, timeout: float = 180.0) -> None:
        """Block until `/v2/health/ready` answers 200; raise with the log tail otherwise."""

        def exited() -> str | None:
            if self._process is not None and self._process.poll() is not None:
                return f"tritonserver exited with {self._process.returncode}\n{self.log_tail()}"
            return None

        try:
            wait_for_http_ok(f"http://{self.http_url}/v2/health/ready", timeout, give_up=exited)
        except TritonStartError as exc:
            raise TritonStartError(f"{exc}\n{self.log_tail()}") from None

    def wait(self) -> int:
        """Block until the server exits; return its exit code."""
        if self._process is None:
            return 0
        return self._process.wait()

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self._process is None:
            return
        terminate(self._process.pid, self.exit_timeout_seconds + 5.0)
        self._process.wait(timeout=5)
        self._process = None


def wait_for_http_ok(url: str, timeout: float, give_up: Callable[[], str | None] = lambda: None) -> None:
    """Poll `url` until it answers 200; `give_up` may end the wait early with a reason."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reason = give_up()
        if reason:
            raise TritonStartError(reason)
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    raise TritonStartError(f"{url} not ready after {timeout:.0f} s")


def terminate(pid: int, timeout: float = 30.0) -> None:
    """SIGTERM `pid` (Triton then finishes in-flight requests), SIGKILL after `timeout`."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False
    except ChildProcessError:
        pass  # not our child: fall back to a signal probe
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
