"""Time a call repeatedly: throughput and per-call p50 / p99, each point within a bounded window.

Each point runs for at least `min_calls` calls and `min_seconds`, and stops at `max_seconds`, so a sweep's cost is
known before it starts; a sweep stops early at its deadline and says which points it left out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Window:
    """How long one point is measured, after `warmup` untimed calls."""

    warmup: int = 3
    min_calls: int = 20
    min_seconds: float = 1.0
    max_seconds: float = 4.0


QUICK = Window(warmup=1, min_calls=2, min_seconds=0.0, max_seconds=0.5)  # the dry run: the code path, not numbers


@dataclass(frozen=True)
class Point:
    """One measured configuration: `batch` rows of `tokens` tokens (texts for a served load, `tokens` 0)."""

    system: str
    batch: int
    tokens: int
    calls: int
    per_second: float  # rows (texts) per second
    p50_ms: float
    p99_ms: float
    in_flight: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {key: round(value, 2) if isinstance(value, float) else value for key, value in asdict(self).items()}

    def line(self) -> str:
        shape = f"{self.batch} x {self.tokens} tokens" if self.tokens else f"{self.batch} texts"
        flight = f", {self.in_flight} in flight" if self.in_flight > 1 else ""
        return (
            f"{self.system}: {shape}{flight}: {self.per_second:,.0f}/s, "
            f"p50 {self.p50_ms:.2f} ms, p99 {self.p99_ms:.2f} ms ({self.calls} calls)"
        )


def percentiles_ms(seconds: Sequence[float]) -> tuple[float, float]:
    values = np.asarray(seconds, dtype=np.float64) * 1000.0
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


def measure(system: str, call: Callable[[], None], batch: int, tokens: int, window: Window) -> Point:
    """Time `call` (which must return only once its work is done: synchronise a GPU inside it)."""
    for _ in range(window.warmup):
        call()
    latencies: list[float] = []
    began = time.perf_counter()
    while True:
        started = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - started)
        spent = time.perf_counter() - began
        enough = len(latencies) >= window.min_calls and spent >= window.min_seconds
        if enough or spent >= window.max_seconds:
            break
    p50, p99 = percentiles_ms(latencies)
    return Point(system, batch, tokens, len(latencies), batch * len(latencies) / spent, p50, p99)


@dataclass
class Sweep:
    """Points measured in order until `deadline` (a `time.monotonic()` value); what did not fit is listed."""

    points: list[Point]
    left_out: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"points": [p.as_dict() for p in self.points], "left_out": self.left_out}


def sweep(
    system: str,
    make_call: Callable[[int, int], Callable[[], None]],
    batches: Sequence[int],
    lengths: Sequence[int],
    window: Window,
    deadline: float,
    say: Callable[[str], None],
) -> Sweep:
    """`measure` each (batch, length) with the call `make_call(batch, length)` builds, shortest rows first."""
    result = Sweep([], [])
    for tokens in lengths:
        for batch in batches:
            # the window bounds a point's time, plus its warm-up calls
            if time.monotonic() + window.max_seconds + 1.0 > deadline:
                result.left_out.append(f"{batch} x {tokens}")
                continue
            point = measure(system, make_call(batch, tokens), batch, tokens, window)
            result.points.append(point)
            say(point.line())
    return result
