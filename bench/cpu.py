"""CPU accounting: what this process, a server's process tree and the whole machine spent during a load.

On a machine whose cores the load generator, the servers and other jobs share, a throughput figure
means little without the CPU each of them used meanwhile; `CpuWindow` reads all of it around one load.
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path

from bench.triton_stats import MODEL, TOKENIZER


def settle_heap() -> None:
    """Collect now and put what survives out of the collector's sight before a measured run. This process
    may hold torch and sentence-transformers (the in-process systems), a heap so large that a full
    collection of it stalls the load generator, inside whatever run it hits, and bills its CPU to that run."""
    gc.collect()
    gc.freeze()


def process_cpu_seconds() -> float:
    """User + system CPU of this process so far (the load generator's own cost)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` and all its live descendants (plus what they reaped), from /proc.

    Triton runs as localtriton -> tritonserver -> one python-backend stub per model instance: the
    top process alone holds almost none of the work.
    """
    return sum(tree_cpu_split(pid).values())


def tree_cpu_split(pid: int, label: Callable[[str], str] | None = None) -> dict[str, float]:
    """`tree_cpu_seconds` by process, summed under `label(command line)` of each process of the tree
    (without `label`, all under "")."""
    parents: dict[int, list[tuple[int, list[str]]]] = {}
    own: list[str] | None = None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(entry.name) == pid:
                own = fields
            parents.setdefault(int(fields[1]), []).append((int(entry.name), fields))
    if own is None:
        return {}
    ticks: dict[str, int] = {}

    def add(process: int, fields: list[str]) -> None:
        name = ""
        if label is not None:
            command = ""  # a process that has just ended
            with contextlib.suppress(OSError):
                command = Path(f"/proc/{process}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            name = label(command)
        ticks[name] = ticks.get(name, 0) + sum(int(value) for value in fields[11:15])

    add(pid, own)
    stack = [pid]
    while stack:
        for child, fields in parents.get(stack.pop(), []):
            add(child, fields)
            stack.append(child)
    return {name: count / os.sysconf("SC_CLK_TCK") for name, count in ticks.items()}


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy so far (every process on the machine), from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(value) for value in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def triton_part(command: str) -> str:
    """The part of Triton a process of its tree is: the encoder's or the tokenizer's python-backend stub,
    or the frontend (tritonserver: gRPC, ensemble scheduling, batching)."""
    for part, model in (("encoder", MODEL), ("tokenizer", TOKENIZER)):
        if f"/{model}/" in command:
            return part
    return "frontend"


class CpuWindow:
    """CPU used during one measurement by the system's servers (Triton's also by part, `triton_part`), by the
    client and by everything else, and how much of the cores stayed idle."""

    def __init__(self, servers: dict[str, int]) -> None:
        self.servers = servers  # name -> pid of the servers doing the work
        self.percent: dict[str, float] = {}

    def __enter__(self) -> CpuWindow:
        settle_heap()  # its collection is the client's set-up, not part of the window
        self._servers = self._read_servers()
        self._client = process_cpu_seconds()
        self._busy = machine_busy_seconds()
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        busy = machine_busy_seconds() - self._busy
        client = process_cpu_seconds() - self._client
        before, after = self._servers, self._read_servers()
        used = {name: sum(after[name].values()) - sum(before[name].values()) for name in self.servers}
        self.percent = {f"{name}_cpu_percent": 100 * seconds / elapsed for name, seconds in used.items()}
        for part, seconds in after.get("triton", {}).items():
            self.percent[f"triton_{part}_cpu_percent"] = 100 * (seconds - before["triton"].get(part, 0.0)) / elapsed
        self.percent["server_cpu_percent"] = 100 * sum(used.values()) / elapsed
        # What the rest of the machine took meanwhile: other jobs compete for the same cores.
        self.percent["foreign_cpu_percent"] = max(0.0, 100 * (busy - client - sum(used.values())) / elapsed)
        self.percent["idle_cpu_percent"] = max(0.0, 100 * (len(os.sched_getaffinity(0)) - busy / elapsed))

    def _read_servers(self) -> dict[str, dict[str, float]]:
        """Each server's CPU seconds so far: Triton's by part, the others' as one."""
        return {
            name: tree_cpu_split(pid, triton_part if name == "triton" else None) for name, pid in self.servers.items()
        }
