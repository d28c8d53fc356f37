"""Triton's statistics into per-load figures: the counters of two snapshots, their difference, the ratios."""

from __future__ import annotations

import math
from typing import Any

from bench.triton_stats import ENSEMBLE, MODEL, ModelCounters, TritonStats, load_counters


def stats(requests: int, rows: int, queue_ns: int, batches: dict[int, tuple[int, int]]) -> dict[str, Any]:
    """A `GET /v2/models/<model>/stats` answer in Triton's shape; `batches`: batch size -> (executions, ns)."""

    def timed(count: int, ns: int) -> dict[str, int]:
        return {"count": count, "ns": ns}

    return {
        "model_stats": [
            {
                "name": "bge_onnx",
                "version": "1",
                "inference_count": rows,
                "execution_count": sum(count for count, _ in batches.values()),
                "inference_stats": {
                    "success": timed(requests, 10**9),
                    "fail": timed(0, 0),
                    "queue": timed(requests, queue_ns),
                    # per request: a batch's time counted once for each of its requests
                    "compute_infer": timed(requests, 10**12),
                },
                "batch_stats": [
                    {
                        "batch_size": size,
                        "compute_input": timed(count, ns // 10),
                        "compute_infer": timed(count, ns - 2 * (ns // 10)),
                        "compute_output": timed(count, ns // 10),
                    }
                    for size, (count, ns) in batches.items()
                ],
            }
        ]
    }


def test_busy_time_counts_each_execution_once_not_once_per_request() -> None:
    counters = ModelCounters.from_stats(stats(6, 12, 30_000_000, {4: (2, 40_000_000), 2: (2, 10_000_000)}))
    assert counters == ModelCounters(requests=6, rows=12, executions=4, queue_ns=30_000_000, busy_ns=50_000_000)


def test_model_versions_are_summed_and_a_model_without_stats_counts_nothing() -> None:
    one = stats(2, 2, 10, {1: (2, 100)})
    two = {"model_stats": one["model_stats"] * 2}
    assert ModelCounters.from_stats(two) == ModelCounters(4, 4, 4, 20, 200)
    assert ModelCounters.from_stats({"model_stats": []}) == ModelCounters()


def test_a_load_is_the_difference_of_the_snapshots_around_it() -> None:
    before = ModelCounters.from_stats(stats(10, 10, 5_000_000, {1: (10, 50_000_000)}))
    after = ModelCounters.from_stats(stats(30, 90, 45_000_000, {1: (10, 50_000_000), 8: (10, 400_000_000)}))
    ensemble = ModelCounters(requests=20)
    figures = load_counters(ensemble, after - before, texts=80, seconds=0.5)
    assert figures == {
        "triton_calls_per_text": 0.25,
        "model_batch": 8.0,
        "model_busy_percent": 80.0,  # 0.4 s of executions in 0.5 s
        "model_queue_ms": 2.0,  # 40 ms over 20 requests
    }


def test_a_load_that_reached_nothing_gives_no_figures_rather_than_a_division_error() -> None:
    figures = load_counters(ModelCounters(), ModelCounters(), texts=0, seconds=0.0)
    assert all(math.isnan(value) for value in figures.values())


async def test_the_figures_wait_for_requests_triton_has_not_counted_yet() -> None:
    """Triton counts a request when it releases it, just after the client has its answer: the last few of a
    load may be missing from the first snapshot after it."""

    class Lagging(TritonStats):
        def __init__(self, counts: list[int]) -> None:
            super().__init__("http://unused")
            self.counts = counts

        def _fetch(self, model: str) -> dict[str, Any]:
            count = self.counts[0] if model == ENSEMBLE else 0
            if model == MODEL and len(self.counts) > 1:
                self.counts.pop(0)  # one snapshot reads both models: the ensemble first
            return stats(count, count, 0, {1: (count, 10**6)})

    triton = Lagging([0, 13, 16, 16])
    before = await triton.snapshot()
    assert (await triton.since(before, texts=16, seconds=1.0))["triton_calls_per_text"] == 1.0
