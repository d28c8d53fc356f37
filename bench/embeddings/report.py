"""The embeddings part's section of the report: its table (ratios to the best in-process INT8 configuration,
and to the old ceiling beside them), the issue's targets judged on the worst of the runs, and the notes that
explain the figures."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from bench.embeddings.loads import Series
from bench.embeddings.plan import (
    CACHE_RATE,
    CEILING_BATCHES,
    GATEWAY_1,
    GATEWAY_32,
    INFINITY_PREFIX,
    NAIVE,
    ORT_ARRIVAL,
    ORT_INT8,
    P99_CONCURRENCY,
    PART,
    TARGET_CONCURRENCY,
    ceiling_systems,
)
from bench.results import PartResult, Point, Target, machine
from bench.run_stats import median
from bench.triton_stats import MODEL, TOKENIZER

# The targets of the issue, each judged on the worst of the runs.
CEILING_SHARE = 0.85
NAIVE_FACTOR = 4.5
INFINITY_FACTOR = 2.5
P99_LIMIT_MS = 50.0
BATCHED_SHARE = 0.95  # 32-text requests against the best in-process configuration
CACHE_P99_LIMIT_MS = 3.0


def build_result(
    series: Sequence[Series],
    opened: Series,
    cache_rate: float,
    notes: list[str],
    infinity_notes: Sequence[str],
    tokenizers: Sequence[Series] = (),
) -> PartResult:
    """Medians into points, the table (ratios to the best in-process configuration and to the old ceiling)
    and the targets, each judged on the worst of the runs."""
    points = [item.point() for item in series]
    cache_point = opened.point() if opened.runs else None
    best = best_ceiling(points)
    old = next((p for p in points if p.system == ORT_INT8), None)
    rows = table_rows(points, best, old)
    if cache_point is not None:
        row = table_rows([cache_point], best, old)[0]
        row["concurrency"] = f"{cache_rate:.0f}/s open loop"
        rows.append(row)
    cpu = machine()
    runs = max((len(item.runs) for item in series), default=0)
    notes = [
        f"machine: {cpu['cpu']}, {cpu['cores']} cores; every target is judged on the worst of the {runs} runs "
        "(met only when every run meets it), with the spread of the runs (min-max) beside it; a ratio is taken "
        "run by run, between measurements of the same round",
        *notes,
        "other CPU %: what the rest of the machine (other users' jobs) used during a measurement; "
        "figures measured while it was high are not comparable with a quiet machine",
        f"Triton's own statistics over each load that reached it: Triton calls/text (below 1 where the gateway "
        f"merged concurrent requests), {MODEL} batch (texts per execution of the encoder), {MODEL} busy % (its "
        f"executions' time over the load's wall time), {MODEL} queue ms (mean wait of a request in its batcher)",
    ]
    if ceiling := ceiling_note(points, best, old):
        notes.append(ceiling)
    if gateway_cpu := gateway_cpu_note(series):
        notes.append(gateway_cpu)
    if budget := cpu_budget(points, len(os.sched_getaffinity(0))):
        notes.append(budget)
    notes += same_batches_notes(points, best)
    if tokenizer := tokenizer_note(tokenizers, points):
        notes.append(tokenizer)
    return PartResult(
        part=PART,
        x_label="concurrency",
        throughput_unit="texts/s",
        points=points,
        table=rows,
        targets=evaluate_targets(points, cache_point, infinity_notes),
        notes=notes,
    )


def best_ceiling(points: Sequence[Point]) -> Point | None:
    """The fastest in-process INT8 configuration (median texts/s): the reference of every ratio."""
    systems = set(ceiling_systems())
    candidates = [point for point in points if point.system in systems and point.throughput > 0]
    return max(candidates, key=lambda point: point.throughput, default=None)


def evaluate_targets(points: Sequence[Point], cache: Point | None, infinity_notes: Sequence[str]) -> list[Target]:
    """The issue's targets, each with the worst of the runs, their spread, and whether every run met it."""
    by = {(point.system, point.x): point for point in points}

    def served(system: str, x: float = TARGET_CONCURRENCY) -> Point | None:
        point = by.get((system, x))
        return point if point and point.throughput > 0 else None

    best, old, gateway = best_ceiling(points), served(ORT_INT8, 1), served(GATEWAY_1)
    single = f"1 text/request at concurrency {TARGET_CONCURRENCY}, every run"
    best_name = f"the best in-process INT8 configuration ({best.system})" if best else "the best in-process INT8"
    peers = [
        point
        for point in points
        if point.system.startswith(INFINITY_PREFIX) and point.x == TARGET_CONCURRENCY and point.throughput > 0
    ]
    fastest = max(peers, key=lambda point: point.throughput, default=None)
    infinity = ratio_target(
        "REST gateway vs infinity-emb", gateway, fastest, INFINITY_FACTOR, f"infinity-emb's fastest engine, {single}"
    )
    if fastest:
        infinity.measured += f" ({fastest.system})"
    elif infinity_notes:
        infinity.measured = "not measured: " + "; ".join(infinity_notes)
    p99 = served(GATEWAY_1, P99_CONCURRENCY)
    return [
        ratio_target(
            "REST gateway vs in-process INT8", gateway, best, CEILING_SHARE, f"{best_name}, {single}", old=old
        ),
        ratio_target("REST gateway vs naive loop", gateway, served(NAIVE, 1), NAIVE_FACTOR, f"naive loop, {single}"),
        infinity,
        latency_target(f"REST gateway p99, 1 text/request, concurrency {P99_CONCURRENCY}", p99, P99_LIMIT_MS, digits=1),
        ratio_target(
            "REST gateway, 32 texts/request vs in-process INT8",
            served(GATEWAY_32),
            best,
            BATCHED_SHARE,
            f"{best_name}, 32 texts/request at concurrency {TARGET_CONCURRENCY}, every run",
            old=old,
        ),
        latency_target(f"cached embeddings p99 at {CACHE_RATE:.0f} requests/s", cache, CACHE_P99_LIMIT_MS, digits=2),
    ]


def run_ratios(value: Point, reference: Point) -> list[float]:
    """The ratio in each round: the systems alternate within a round, so its two runs shared the machine's
    state; without per-run samples, the ratio of the medians."""
    values, references = value.samples or [value.throughput], reference.samples or [reference.throughput]
    return [a / b for a, b in zip(values, references, strict=False) if b > 0] or [
        value.throughput / reference.throughput
    ]


def ratio_target(
    name: str, value: Point | None, reference: Point | None, factor: float, against: str, *, old: Point | None = None
) -> Target:
    """`value` >= `factor` x `reference` in every run; `old` adds the ratio to the old ceiling, for continuity."""
    goal = f">= {factor:g} x {against}"
    if value is None or reference is None:
        return Target(name, goal, "not measured", False)
    ratios = run_ratios(value, reference)
    measured = (
        f"worst {min(ratios):.2f} x of {len(ratios)} runs (spread {min(ratios):.2f}-{max(ratios):.2f}; medians "
        f"{value.throughput:.0f} vs {reference.throughput:.0f} texts/s)"
    )
    if old is not None and old is not reference:
        measured += f"; vs the old ceiling ({old.system}) worst {min(run_ratios(value, old)):.2f} x"
    return Target(name, goal, measured, min(ratios) >= factor)


def latency_target(name: str, point: Point | None, limit_ms: float, *, digits: int) -> Target:
    """p99 <= `limit_ms` in every run."""
    samples = [] if point is None else point.p99_samples or [point.p99_ms]
    finite = [value for value in samples if math.isfinite(value)]
    goal = f"<= {limit_ms:g} ms, every run"
    if not finite or len(finite) < len(samples):
        return Target(name, goal, "not measured", False)
    worst = max(finite)
    spread = f"{min(finite):.{digits}f}-{worst:.{digits}f}"
    return Target(
        name, goal, f"worst {worst:.{digits}f} ms of {len(finite)} runs (spread {spread} ms)", worst <= limit_ms
    )


def ceiling_note(points: Sequence[Point], best: Point | None, old: Point | None) -> str | None:
    """Every in-process INT8 configuration of this run, and which one is the ceiling."""
    if best is None:
        return None
    by = {point.system: point for point in points}
    measured = [f"{system} {by[system].throughput:.0f}" for system in ceiling_systems() if system in by]
    note = (
        f"in-process INT8 configurations (same texts sorted by token length, same cores, same run), texts/s: "
        f"{'; '.join(measured)}. The best, reference of every ratio: {best.system}"
    )
    if old is not None and old is not best:
        note += f"; the old ceiling ({old.system}) reaches {old.throughput / best.throughput:.2f} x it"
    return note


def gateway_cpu_note(series: Sequence[Series]) -> str | None:
    """The gateway's CPU per text at the throughput targets' setting, run by run: the figure the issue halves."""
    served = next((item for item in series if (item.system, item.x) == (GATEWAY_1, TARGET_CONCURRENCY)), None)
    if served is None:
        return None
    per_text = [
        1000 * window["gateway_cpu_percent"] / 100 * stats.elapsed / stats.items
        for stats, window in zip(served.runs, served.cpu, strict=True)
        if "gateway_cpu_percent" in window and stats.items
    ]
    if not per_text:
        return None
    return (
        f"gateway CPU per text, {GATEWAY_1} at concurrency {TARGET_CONCURRENCY}: {median(per_text):.3f} ms "
        f"(median of {len(per_text)} runs, spread {min(per_text):.3f}-{max(per_text):.3f} ms)"
    )


def tokenizer_note(tokenizers: Sequence[Series], points: Sequence[Point]) -> str | None:
    """The tokenizer stage's CPU per text, in process: on coalesced batches (what the gateway could do) and
    per 1-text request (as the python backend packs each request), beside what the served stage cost."""
    per_text = {
        item.system: median([1000 * stats.client_cpu_seconds / stats.items for stats in item.runs if stats.items])
        for item in tokenizers
        if item.runs
    }
    if not per_text:
        return None
    parts = [f"{system} {ms:.3f} ms" for system, ms in per_text.items()]
    served = next((p for p in points if (p.system, p.x) == (GATEWAY_1, TARGET_CONCURRENCY)), None)
    if served is not None and served.throughput > 0 and "triton_tokenizer_cpu_percent" in served.extra:
        stage = 10 * served.extra["triton_tokenizer_cpu_percent"] / served.throughput
        parts.append(f"served: Triton's {TOKENIZER} (python backend, its IPC included) at concurrency "
                     f"{TARGET_CONCURRENCY} {stage:.3f} ms")  # fmt: skip
    return "tokenizer stage, CPU per text (median of runs): " + "; ".join(parts)


def cpu_budget(points: Sequence[Point], cores: int) -> str | None:
    """Where the cores went at the ceiling target's setting, per text, and the throughput they bound: what
    an encoder as lean as the best in-process configuration would reach with the rest of the stack's CPU
    as measured."""
    by = {(point.system, point.x): point for point in points}
    served, ceiling = by.get((GATEWAY_1, TARGET_CONCURRENCY)), best_ceiling(points)
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
        f"{per_text(served.extra['triton_encoder_cpu_percent'], served.throughput):.2f} ms (best in-process "
        f"{ceiling_ms:.2f} ms), the rest {rest_ms:.2f} ms ({parts}), cores idle "
        f"{served.extra.get('idle_cpu_percent', float('nan')):.0f} %. With everything on these {cores} cores, an "
        f"encoder as lean as the ceiling and no idle core would reach at most {bound:.0f} texts/s = "
        f"{bound / ceiling.throughput:.2f} x the best in-process"
    )


def same_batches_notes(points: Sequence[Point], best: Point | None) -> list[str]:
    """For each served load a ratio target is judged on: the encoder alone in process, as served, on batches
    in arrival order of the size its calls held, against the served rate and against what the target asks.
    A goal above 1 x that figure asks the stack to beat its own encoder with no server around it."""
    by = {(point.system, point.x): point for point in points}
    notes = []
    for system, share in ((GATEWAY_1, CEILING_SHARE), (GATEWAY_32, BATCHED_SHARE)):
        served = by.get((system, TARGET_CONCURRENCY))
        held = served.extra.get("model_batch", 0.0) if served else 0.0
        if best is None or served is None or served.throughput <= 0 or held <= 0:
            continue
        size = min(CEILING_BATCHES, key=lambda batch: abs(batch - held))
        alone = by.get((ORT_ARRIVAL.format(batch=size), 1))
        if alone is None or alone.throughput <= 0:
            continue
        asked = share * best.throughput
        notes.append(
            f"{system} at concurrency {TARGET_CONCURRENCY}: the encoder's batches held {held:.1f} texts; "
            f"bge_onnx's encoder alone on batches of {size} in arrival order made {alone.throughput:.0f} texts/s "
            f"({alone.throughput / best.throughput:.2f} x the best in-process), the served path "
            f"{served.throughput:.0f} = {served.throughput / alone.throughput:.2f} x it; the goal of {share:g} x "
            f"the best ({asked:.0f} texts/s) is {asked / alone.throughput:.2f} x what the encoder alone makes of "
            f"such batches"
        )
    return notes


def table_rows(points: Sequence[Point], best: Point | None, old: Point | None) -> list[dict[str, Any]]:
    """One row per point: its medians, the CPU around it, its ratios to the best in-process configuration and to
    the old ceiling, and what Triton saw of it."""

    def ratio(point: Point, reference: Point | None) -> float:
        return point.throughput / reference.throughput if reference and reference.throughput > 0 else float("nan")

    rows = []
    for point in points:
        extra = point.extra
        gateway_cpu = extra.get("gateway_cpu_percent", float("nan"))
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
                "gateway CPU ms/text": 10 * gateway_cpu / point.throughput if point.throughput > 0 else float("nan"),
                "x best in-process": ratio(point, best),
                "x old ceiling": ratio(point, old),
                "Triton calls/text": extra.get("triton_calls_per_text", float("nan")),
                f"{MODEL} batch": extra.get("model_batch", float("nan")),
                f"{MODEL} busy %": extra.get("model_busy_percent", float("nan")),
                f"{MODEL} queue ms": extra.get("model_queue_ms", float("nan")),
                "errors": int(extra.get("errors", 0)),
            }
        )
    return rows
