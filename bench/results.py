"""What a part records: its measured points, table and targets (`PartResult`), and the machine it ran on.

A part (`bench/embeddings/`, `bench/chat/`, `bench/video/`, `bench/caches.py`, `bench/gpu.py`)
returns a `PartResult`; `bench/report.py` turns the parts of one run into `report.md`, `results.json`
and plots.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.run_stats import RunStats, median


@dataclass
class Point:
    """One measured setting of one system: medians over `runs` runs (each run's values in `samples`)."""

    system: str
    x: float  # the swept variable (concurrency, rate, ...)
    throughput: float  # median, in the series' unit
    p50_ms: float
    p99_ms: float
    samples: list[float] = field(default_factory=list)  # each run's throughput, in the order of the runs
    p99_samples: list[float] = field(default_factory=list)  # each run's p99 latency (ms), same order
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

    @classmethod
    def read(cls, path: Path) -> PartResult:
        """What `write` wrote."""
        saved = json.loads(path.read_text())
        points = [Point(**point) for point in saved.pop("points")]
        targets = [Target(**target) for target in saved.pop("targets")]
        return cls(**saved, points=points, targets=targets)


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
        p99_samples=[run.p(99) for run in runs],
        extra={"client_cpu_percent": median(cpu), "errors": float(sum(run.errors for run in runs))},
    )


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


def load_note(at_start: float) -> str:
    """The machine's 1-minute load average around the part: other work on it shows up in the latencies."""
    return (
        f"Load average (1 min) at the start / end of the part: {at_start:.1f} / {os.getloadavg()[0]:.1f} "
        f"on {len(os.sched_getaffinity(0))} cores; above the core count, other processes shared the CPUs."
    )
