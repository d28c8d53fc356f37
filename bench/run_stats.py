"""Statistics of a load: one run's latencies and counts (`RunStats`), percentiles and medians."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


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
