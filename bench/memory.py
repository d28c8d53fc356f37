"""Memory accounting: what a process and its descendants hold resident (from /proc), now and at the peak of a
stretch of work, and what a folder takes on disk."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from types import TracebackType

FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM")  # kB in /proc/<pid>/status


def descendants(pid: int) -> list[int]:
    """`pid`'s live children, their children, and so on."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def status_bytes(pid: int) -> dict[str, int]:
    """`FIELDS` of one process, in bytes (empty if it has ended)."""
    values: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in FIELDS:
                values[name] = int(rest.split()[0]) * 1024
    return values


def tree_memory(pid: int) -> dict[str, int]:
    """`FIELDS` summed over `pid` and its descendants (VmHWM, each process's own peak, summed too), and the
    number of processes under `processes`."""
    tree = [pid, *descendants(pid)]
    total = dict.fromkeys(FIELDS, 0)
    for process in tree:
        for name, value in status_bytes(process).items():
            total[name] += value
    return {**total, "processes": len(tree)}


class PeakMemory:
    """The largest resident total of a process tree (default: this process's) sampled while the block runs, and
    of its descendants alone (a child that builds an index)."""

    def __init__(self, pid: int | None = None, every_s: float = 0.5) -> None:
        self._pid = os.getpid() if pid is None else pid
        self._every = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="peak-memory", daemon=True)
        self.bytes = 0
        self.children_bytes = 0

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while True:
            children = sum(status_bytes(child).get("VmRSS", 0) for child in descendants(self._pid))
            self.children_bytes = max(self.children_bytes, children)
            self.bytes = max(self.bytes, status_bytes(self._pid).get("VmRSS", 0) + children)
            if self._stop.wait(self._every):
                return


def directory_bytes(folder: Path) -> int:
    """Bytes the files under `folder` take on disk (allocated blocks: sparse files count what they hold)."""
    return sum(path.lstat().st_blocks * 512 for path in folder.rglob("*") if path.is_file() and not path.is_symlink())
