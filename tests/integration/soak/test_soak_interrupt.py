"""`python -m bench soak` promises that Ctrl-C (SIGINT) stops every process it started, the children of those
processes included. The soak is interrupted while it starts the platform, once Milvus standalone (milvus-server,
which spawns Milvus) and the Tritons (which spawn their python backends) have children of their own: the processes
a stop that signals only the leader would leave behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.checkout import ROOT
from tests.integration.soak.test_soak_short import processes_mentioning


@dataclass(frozen=True)
class Seen:
    """A process, told apart from a later one with the same pid by its start time."""

    pid: int
    started: int
    name: str
    group: int

    def alive(self) -> bool:
        read = read_stat(self.pid)
        return read is not None and read[0] == self.started and read[3] != "Z"


def read_stat(pid: int) -> tuple[int, int, str, str] | None:
    """(start time, parent, name, state) from /proc/<pid>/stat; None once it is gone."""
    try:
        head, tail = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)
    except OSError:
        return None
    fields = tail.split()
    return int(fields[19]), int(fields[1]), head.split("(", 1)[1], fields[0]


def descendants(root: int) -> list[Seen]:
    """Every live process below `root`, from one pass over /proc."""
    children: dict[int, list[Seen]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            tail = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        read = read_stat(int(entry))
        if read is not None:
            seen = Seen(int(entry), read[0], read[2], int(tail[2]))
            children.setdefault(read[1], []).append(seen)
    found, pending = [], [root]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child.pid)
    return found


def has_grandchildren(seen: set[Seen], leader: str) -> bool:
    """A child of the soak named `leader` has a process below it in its group."""
    leaders = {process.pid for process in seen if process.name == leader and process.group == process.pid}
    return any(process.group in leaders and process.pid != process.group for process in seen)


@pytest.mark.slow
def test_a_soak_interrupted_with_sigint_stops_every_process_it_started(minilm_repository: Path, tmp_path: Path) -> None:
    out, output = tmp_path / "soak", tmp_path / "soak.out"
    command = [sys.executable, "-m", "bench", "soak", "--short", "--out", str(out)]
    command += ["--repository", str(minilm_repository)]
    with output.open("wb") as written:
        soak = subprocess.Popen(command, cwd=ROOT, stdout=written, stderr=subprocess.STDOUT)
    seen: set[Seen] = set()
    try:
        deadline = time.monotonic() + 90
        while not (has_grandchildren(seen, "milvus-server") and has_grandchildren(seen, "tritonserver")):
            assert soak.poll() is None, f"the soak exited with {soak.returncode}: {output.read_text()}"
            assert time.monotonic() < deadline, f"Milvus and Triton had no children after 90 s: {sorted(seen, key=str)}"
            seen.update(descendants(soak.pid))
            time.sleep(0.2)
        soak.send_signal(signal.SIGINT)
        # What it starts while it stops counts too (the rest of the platform, once a stop raced its start).
        deadline = time.monotonic() + 90
        while soak.poll() is None and time.monotonic() < deadline:
            seen.update(descendants(soak.pid))
            time.sleep(0.2)
    finally:
        if soak.poll() is None:
            soak.kill()
        soak.wait()
        left = [process for process in seen if process.alive()]
        mentioning = processes_mentioning(str(out))
        # A failed run must not leave the platform behind for the next test: every group it started.
        groups = {process.group for process in left}
        for pid in mentioning:
            with contextlib.suppress(ProcessLookupError):
                groups.add(os.getpgid(pid))
        for group in groups - {os.getpgrp()}:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)

    assert soak.returncode == 130, output.read_text()
    assert "interrupted: every process the soak started is stopped" in output.read_text()
    assert {process.name for process in seen} >= {"redis-server", "milvus-server", "tritonserver"}
    assert left == [], "a process the soak started outlived it"
    assert mentioning == [], "a process of the platform outlived the soak"
