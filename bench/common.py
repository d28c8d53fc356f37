"""What every benchmark part shares: load generation, statistics, processes, CPU accounting, results.

A part (`bench/embeddings.py`, `bench/chat.py`, `bench/images.py`, `bench/caches.py`) returns a
`PartResult`; `bench/report.py` turns the parts of one run into `report.md`, `results.json` and plots.

Load: `closed_loop` keeps `concurrency` requests in flight until `total` are done (throughput at a
concurrency); `open_loop` starts requests at a fixed rate whatever the answers do (latency at a load,
without the coordinated omission of a closed loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
log = logging.getLogger(__name__)


# -- statistics ---------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class RunStats:
    """One run of a load: how long it took, each request's latency (s), how many failed."""

    elapsed: float
    latencies: list[float]
    errors: int = 0
    items: int = 0  # work units done (texts, tokens...), when a request carries more than one
    client_cpu_seconds: float = 0.0

    @property
    def requests_per_second(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def items_per_second(self) -> float:
        return self.items / self.elapsed if self.elapsed > 0 else 0.0

    def p(self, q: float) -> float:
        """Latency percentile in milliseconds."""
        return percentile(self.latencies, q) * 1000


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- load generation ----------------------------------------------------------------------------------


async def closed_loop(request: Callable[[int], Awaitable[int]], *, total: int, concurrency: int) -> RunStats:
    """Run request(i) for i in range(total) with `concurrency` in flight; each returns its work units."""
    latencies: list[float] = []
    errors = 0
    items = 0
    next_index = 0

    async def worker() -> None:
        nonlocal next_index, errors, items
        while next_index < total:
            index = next_index
            next_index += 1
            started = time.perf_counter()
            try:
                done = await request(index)  # not `items += await ...`: that reads `items` before awaiting
            except Exception as exc:
                errors += 1
                _log_failure(errors, index, exc)
                continue
            items += done
            latencies.append(time.perf_counter() - started)

    settle_heap()
    cpu = process_cpu_seconds()
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return RunStats(elapsed, latencies, errors, items, process_cpu_seconds() - cpu)


def _log_failure(errors: int, index: int, exc: Exception) -> None:
    """The first failure of a run, so that an error count in the report has a cause in the log."""
    if errors == 1:
        log.warning("request %d failed: %s", index, repr(exc)[:300])


def settle_heap() -> None:
    """Collect now and put what survives out of the collector's sight before a measured run. This process
    may hold torch and sentence-transformers (the in-process systems): ~430,000 objects, and a full
    collection of them stalls the load generator for 60-400 ms on 2 cores, inside whatever run it hits."""
    gc.collect()
    gc.freeze()


async def open_loop(request: Callable[[int], Awaitable[int]], *, rate: float, duration: float) -> RunStats:
    """Start request(i) every 1/rate s for `duration` s; latency counts from the scheduled start."""
    latencies: list[float] = []
    errors = 0
    items = 0
    count = int(rate * duration)

    async def one(index: int, scheduled: float) -> None:
        nonlocal errors, items
        try:
            done = await request(index)
        except Exception as exc:
            errors += 1
            _log_failure(errors, index, exc)
            return
        items += done
        latencies.append(time.perf_counter() - scheduled)

    settle_heap()
    cpu = process_cpu_seconds()
    started = time.perf_counter()
    tasks = []
    for index in range(count):
        scheduled = started + index / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(index, scheduled)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    return RunStats(elapsed, latencies, errors, items, process_cpu_seconds() - cpu)


@contextlib.asynccontextmanager
async def aiohttp_session(limit: int, timeout: float = 120.0) -> AsyncIterator[aiohttp.ClientSession]:
    """A load generator's pooled client: aiohttp, about a third of httpx's CPU per request, which matters
    on cores it shares with the systems it measures. `limit` 0: no connection limit, so that a request of
    an open loop never waits in the client for another's connection (that wait would be measured as the
    server's latency)."""
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout), read_bufsize=2**20
    ) as session:
        yield session


def http_client(concurrency: int, timeout: float = 120.0) -> httpx.AsyncClient:
    """One pooled client per load: keep-alive connections for every concurrent request."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.AsyncClient(timeout=timeout, limits=limits)


# -- CPU accounting -----------------------------------------------------------------------------------


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


def machine() -> dict[str, Any]:
    """What the numbers were measured on; absolute figures are only quoted with this."""
    cpu_model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": cpu_model,
        "cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(memory_gib, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


# -- processes ----------------------------------------------------------------------------------------


class ServerProcess:
    """A server started as a subprocess (own session), waited for on a URL, stopped on exit."""

    def __init__(self, name: str, command: Sequence[str], *, env: dict[str, str] | None = None, log_dir: Path) -> None:
        self.name = name
        self.command = list(command)
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, ready_url: str, *, timeout: float = 180.0) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}; see {self.log_path}")
            with contextlib.suppress(httpx.HTTPError):
                response = httpx.get(ready_url, timeout=2)
                if response.status_code == 200:
                    return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} not ready at {ready_url} after {timeout:.0f} s; see {self.log_path}")

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
    try:
        for server, url in servers:
            server.start(url)
            started.append(server)
        yield
    finally:
        for server in reversed(started):
            server.stop()


def venv_python(name: str, requirements: Sequence[str]) -> Path:
    """A virtual environment of its own under .run/bench-venvs (a peer's pins never touch ours)."""
    venv = ROOT / ".run" / "bench-venvs" / name
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    wanted = "\n".join(requirements)
    if not (stamp.exists() and stamp.read_text() == wanted):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements], check=True)
        stamp.write_text(wanted)
    return python


# -- results ------------------------------------------------------------------------------------------


@dataclass
class Point:
    """One measured setting of one system: medians over `runs` runs (each run's values in `samples`)."""

    system: str
    x: float  # the swept variable (concurrency, rate, ...)
    throughput: float  # median, in the series' unit
    p50_ms: float
    p99_ms: float
    samples: list[float] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)  # e.g. client_cpu_percent, server_cpu_percent


@dataclass
class Target:
    name: str
    goal: str  # e.g. ">= 0.85 x in-process INT8"
    measured: str
    met: bool


@dataclass
class PartResult:
    """One part's results: swept series for the plots, a table, and its targets."""

    part: str
    x_label: str  # e.g. "concurrency"
    throughput_unit: str  # e.g. "texts/s"
    points: list[Point] = field(default_factory=list)
    table: list[dict[str, Any]] = field(default_factory=list)  # rows for the Markdown report
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.part}.json"
        path.write_text(json.dumps(asdict(self), indent=2, ensure_ascii=False) + "\n")
        return path


def summarize(system: str, x: float, runs: Sequence[RunStats], *, per: str = "items") -> Point:
    """Medians over runs of throughput (items or requests per second) and latency percentiles."""
    rates = [run.items_per_second if per == "items" else run.requests_per_second for run in runs]
    cpu = [100 * run.client_cpu_seconds / run.elapsed for run in runs if run.elapsed > 0]
    return Point(
        system=system,
        x=x,
        throughput=median(rates),
        p50_ms=median([run.p(50) for run in runs]),
        p99_ms=median([run.p(99) for run in runs]),
        samples=rates,
        extra={"client_cpu_percent": median(cpu), "errors": float(sum(run.errors for run in runs))},
    )
