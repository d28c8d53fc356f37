"""The embeddings part's section of the report: its table (ratios to the in-process INT8 ceiling), the
issue's targets with what was measured against them, and the notes that explain the figures."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from bench.embeddings.loads import Series
from bench.embeddings.plan import (
    CACHE_RATE,
    GATEWAY_1,
    INFINITY_PREFIX,
    NAIVE,
    ORT_INT8,
    P99_CONCURRENCY,
    PART,
    TARGET_CONCURRENCY,
)
from bench.results import PartResult, Point, Target
from bench.triton_stats import MODEL

# The targets of the issue.
CEILING_SHARE = 0.85
NAIVE_FACTOR = 4.5
INFINITY_FACTOR = 2.5
P99_LIMIT_MS = 60.0
CACHE_P99_LIMIT_MS = 5.0


def build_result(
    series: Sequence[Series], opened: Series, cache_rate: float, notes: list[str], infinity_notes: Sequence[str]
) -> PartResult:
    """Medians into points, the table (ratios to the in-process INT8 ceiling) and the targets."""
    points = [item.point() for item in series]
    cache_point = opened.point() if opened.runs else None
    reference = next((p.throughput for p in points if p.system == ORT_INT8), None)
    rows = table_rows(points, reference)
    if cache_point is not None:
        row = table_rows([cache_point], reference)[0]
        row["concurrency"] = f"{cache_rate:.0f}/s open loop"
        rows.append(row)
    notes = [
        *notes,
        "other CPU %: what the rest of the machine (other users' jobs) used during a measurement; "
        "figures measured while it was high are not comparable with a quiet machine",
        f"Triton's own statistics over each load that reached it: Triton calls/text (below 1 where the gateway "
        f"merged concurrent requests), {MODEL} batch (texts per execution of the encoder), {MODEL} busy % (its "
        f"executions' time over the load's wall time), {MODEL} queue ms (mean wait of a request in its batcher)",
    ]
    if budget := cpu_budget(points, len(os.sched_getaffinity(0))):
        notes.append(budget)
    return PartResult(
        part=PART,
        x_label="concurrency",
        throughput_unit="texts/s",
        points=points,
        table=rows,
        targets=evaluate_targets(points, cache_point.p99_ms if cache_point else None, infinity_notes),
        notes=notes,
    )


def evaluate_targets(
    points: Sequence[Point], cache_p99_ms: float | None, infinity_notes: Sequence[str]
) -> list[Target]:
    """The issue's targets from the medians: each with its measured value and whether it is met."""
    by = {(point.system, point.x): point for point in points}

    def throughput(system: str, x: float = 1) -> float | None:
        point = by.get((system, x))
        return point.throughput if point and point.throughput > 0 else None

    gateway = throughput(GATEWAY_1, TARGET_CONCURRENCY)
    targets = []
    for name, reference, factor, goal in (
        ("REST gateway vs in-process INT8", throughput(ORT_INT8), CEILING_SHARE, "in-process INT8 ceiling"),
        ("REST gateway vs naive loop", throughput(NAIVE), NAIVE_FACTOR, "naive sentence-transformers loop"),
    ):
        targets.append(ratio_target(name, gateway, reference, factor, f"{goal} (same run)"))
    peers = [
        (point.throughput, point.system)
        for point in points
        if point.system.startswith(INFINITY_PREFIX) and point.x == TARGET_CONCURRENCY and point.throughput > 0
    ]
    fastest = max(peers, default=None)
    infinity = ratio_target(
        "REST gateway vs infinity-emb", gateway, fastest[0] if fastest else None, INFINITY_FACTOR, "infinity-emb"
    )
    if fastest:
        infinity.measured += f" ({fastest[1]})"
    elif infinity_notes:
        infinity.measured = "not measured: " + "; ".join(infinity_notes)
    targets.append(infinity)
    p99 = by.get((GATEWAY_1, P99_CONCURRENCY))
    targets.append(
        latency_target(
            f"REST gateway p99, 1 text/request, concurrency {P99_CONCURRENCY}",
            p99.p99_ms if p99 else None,
            P99_LIMIT_MS,
            digits=1,
        )
    )
    targets.append(
        latency_target(
            f"cached embeddings p99 at {CACHE_RATE:.0f} requests/s", cache_p99_ms, CACHE_P99_LIMIT_MS, digits=2
        )
    )
    return targets


def ratio_target(name: str, value: float | None, reference: float | None, factor: float, against: str) -> Target:
    goal = f">= {factor:g} x {against}, 1 text/request at concurrency {TARGET_CONCURRENCY}"
    if value is None or reference is None:
        return Target(name, goal, "not measured", False)
    ratio = value / reference
    return Target(name, goal, f"{ratio:.2f} x ({value:.0f} vs {reference:.0f} texts/s)", ratio >= factor)


def latency_target(name: str, p99_ms: float | None, limit_ms: float, *, digits: int) -> Target:
    measured = p99_ms if p99_ms is not None and math.isfinite(p99_ms) else None
    return Target(
        name,
        f"<= {limit_ms:g} ms",
        f"{measured:.{digits}f} ms" if measured is not None else "not measured",
        measured is not None and measured <= limit_ms,
    )


def cpu_budget(points: Sequence[Point], cores: int) -> str | None:
    """Where the cores went at the ceiling target's setting, per text, and the throughput they bound: what
    an encoder as lean as the in-process ceiling would reach with the rest of the stack's CPU as measured."""
    by = {(point.system, point.x): point for point in points}
    served, ceiling = by.get((GATEWAY_1, TARGET_CONCURRENCY)), by.get((ORT_INT8, 1))
    if served is None or ceiling is None or served.throughput <= 0 or ceiling.throughput <= 0:
        return None
    if "triton_encoder_cpu_percent" not in served.extra:
        return None

    def per_text(percent: float, throughput: float) -> float:
        return 10 * percent / throughput  # ms of CPU per text: percent / 100 * 1000 ms

    rest = {
        "gateway": served.extra.get("gateway_cpu_percent", 0.0),
        "Triton frontend": served.extra.get("triton_frontend_cpu_percent", 0.0),
        "tokenizer": served.extra.get("triton_tokenizer_cpu_percent", 0.0),
        "load generator": served.extra.get("client_cpu_percent", 0.0),
    }
    rest_ms = sum(per_text(percent, served.throughput) for percent in rest.values())
    ceiling_ms = per_text(ceiling.extra.get("client_cpu_percent", 0.0), ceiling.throughput)
    bound = cores * 1000 / (ceiling_ms + rest_ms)
    parts = ", ".join(f"{name} {per_text(percent, served.throughput):.2f}" for name, percent in rest.items())
    return (
        f"CPU per text, {GATEWAY_1} at concurrency {TARGET_CONCURRENCY}: encoder "
        f"{per_text(served.extra['triton_encoder_cpu_percent'], served.throughput):.2f} ms (in-process ceiling "
        f"{ceiling_ms:.2f} ms), the rest {rest_ms:.2f} ms ({parts}), cores idle "
        f"{served.extra.get('idle_cpu_percent', float('nan')):.0f} %. With everything on these {cores} cores, an "
        f"encoder as lean as the ceiling and no idle core would reach at most {bound:.0f} texts/s = "
        f"{bound / ceiling.throughput:.2f} x the ceiling"
    )


def table_rows(points: Sequence[Point], reference: float | None) -> list[dict[str, Any]]:
    rows = []
    for point in points:
        extra = point.extra
        rows.append(
            {
                "system": point.system,
                "concurrency": int(point.x),
                "texts/s": point.throughput,
                "p50 ms": point.p50_ms,
                "p99 ms": point.p99_ms,
                "client CPU %": extra.get("client_cpu_percent", float("nan")),
                "server CPU %": extra.get("server_cpu_percent", float("nan")),
                "other CPU %": extra.get("foreign_cpu_percent", float("nan")),
                "x INT8 in-process": point.throughput / reference if reference else float("nan"),
                "Triton calls/text": extra.get("triton_calls_per_text", float("nan")),
                f"{MODEL} batch": extra.get("model_batch", float("nan")),
                f"{MODEL} busy %": extra.get("model_busy_percent", float("nan")),
                f"{MODEL} queue ms": extra.get("model_queue_ms", float("nan")),
                "errors": int(extra.get("errors", 0)),
            }
        )
    return rows
