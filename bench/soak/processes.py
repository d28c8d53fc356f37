"""One supervised process of the soak's platform: started in a process group of its own, waited for until it
answers, stopped, killed, paused or restarted on command, and read from /proc (RSS, open files).

Every process the soak starts is one of these, so that one `stop_all` on exit (normal, Ctrl-C or failure) ends
every process group it started, Triton's python backends, Milvus' etcd and the busy loops included.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from bench.paths import ROOT

Probe = Callable[[], bool]


def http_ok(url: str) -> Probe:
    """A readiness probe: `url` answers 200."""

    def probe() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(url, timeout=2).status_code == 200
        return False

    return probe


def tcp_open(port: int) -> Probe:
    """A readiness probe: something accepts connections on 127.0.0.1:`port`."""

    def probe() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            return False

    return probe


class Supervised:
    """A process the soak starts again with the same command, ports and files (a pod with its volume)."""

    def __init__(
        self, name: str, command: Sequence[str], *, log_dir: Path, ready: Probe, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.command = list(command)
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_dir / f"{name}.log"
        self.ready = ready
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.held = False  # stopped on purpose: the supervisor leaves it down
        self.closed = False  # stopped for good (`close`): a start under way gives up, a later one refuses
        self.stop_signal = signal.SIGTERM  # what asks it to stop gracefully
        self.signal_group = False  # send it to every process of the group, not the leader alone

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, *, timeout: float = 180.0) -> None:
        """Start it and wait until its probe passes; raise (after stopping it) if it exits, times out or is closed
        meanwhile."""
        if self.closed:
            raise RuntimeError(f"{self.name} is closed: not starting it")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.starts += 1
        self.held = False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}; see {self.log_path}")
            # `close` in another thread may have come before the process existed, and found nothing to stop.
            if self.closed:
                self.kill()
                raise RuntimeError(f"{self.name} was closed while it started")
            if self.ready():
                return
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s; see {self.log_path}")

    def signal(self, number: int) -> None:
        """Send `number` to the whole process group (its children: Triton's backends, Milvus' parts)."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, number)

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a lost node does; waits for the exit."""
        self.held = True
        self.signal(signal.SIGKILL)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)

    def stop(self, *, grace: float = 30.0) -> None:
        """`stop_signal` to the leader (or the whole group: `signal_group`), then wait up to `grace` seconds for
        every process of the group to exit (a child may outlive its leader while it shuts down), then SIGKILL
        what is left."""
        self.held = True
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            if self.signal_group:
                self.signal(self.stop_signal)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, self.stop_signal)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and (process.poll() is None or process_groups().get(process.pid)):
                time.sleep(0.1)
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)

    def close(self, *, grace: float = 30.0) -> None:
        """Stop it for good: a start under way in another thread (a restart, the platform's start) stops it too."""
        self.closed = True
        self.stop(grace=grace)

    def rss_bytes(self, members: list[int] | None = None) -> int | None:
        """Resident memory of the whole group (a container's figure), from /proc."""
        total = 0
        for pid in process_groups().get(self.pid or -1, []) if members is None else members:
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            except OSError:
                continue
        return total or None

    def open_fds(self) -> int | None:
        """Open files of the leader (the gateway is one process)."""
        pid = self.pid
        if pid is None or not self.alive():
            return None
        try:
            return len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            return None

    def connections_on(self, port: int) -> int:
        """The leader's sockets that are TCP connections to its local `port` (accepted ones, not its listener)."""
        return sum(1 for local, _remote in self.tcp_connections() if local == port)

    def tcp_connections(self) -> list[tuple[int, int]]:
        """(local port, remote port) of each TCP connection the leader holds, listeners left out."""
        pid = self.pid
        if pid is None or not self.alive():
            return []
        inodes = set()
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
            lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
        except OSError:
            return []
        held = []
        for line in lines:  # sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            fields = line.split()
            if fields[3] != "0A" and fields[9] in inodes:  # 0A: LISTEN
                held.append((int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)))
        return held

    def open_file_kinds(self) -> dict[str, int]:
        """The leader's open files by kind: a file's path, or socket, pipe, anon_inode:[eventpoll] ..."""
        pid, kinds = self.pid, Counter[str]()
        if pid is None or not self.alive():
            return {}
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    kinds[target.split(":[", 1)[0] if ":[" in target else target] += 1
        return dict(kinds)

    def cpu_seconds(self, members: list[int] | None = None) -> float | None:
        """User + system CPU of the group's live processes, from /proc/<pid>/stat."""
        total, ticks = 0.0, os.sysconf("SC_CLK_TCK")
        members = process_groups().get(self.pid or -1, []) if members is None else members
        for pid in members:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / ticks
        return total if members else None


def process_groups() -> dict[int, list[int]]:
    """Every live process by its process group id, from one pass over /proc."""
    groups: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            groups.setdefault(int(fields[2]), []).append(int(entry))
    return groups


def stop_all(processes: Sequence[Supervised]) -> None:
    """Close every process, in reverse order of start; a failure to stop one does not spare the others."""
    for process in reversed(processes):
        with contextlib.suppress(Exception):
            process.close(grace=15)
