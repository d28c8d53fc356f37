"""The video part's table, targets and notes, from the submit points and the completion runs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from bench.results import Point, Target
from bench.run_stats import median
from bench.video.completion import CompletionRun
from bench.video.plan import (
    COMPLETION_RATE,
    DEADLINE_MARGIN_SECONDS,
    GRACE_AFTER_JOB_SECONDS,
    JOB_SECONDS,
    LOSS_RATE,
    TARGET_P99_MS,
    TARGET_RATE,
    TASK_TIMEOUT_SECONDS,
    WARMUP_REQUESTS,
)


def submit_row(point: Point) -> dict[str, object]:
    return {
        "measurement": f"submit, {point.system}",
        "offered /s": point.x,
        "achieved /s": point.throughput,
        "p50 ms": point.p50_ms,
        "p99 ms": point.p99_ms,
        "max ms": point.extra["max_ms"],
        "errors (all runs)": error_kinds(point),
        "gateway CPU %": point.extra["gateway_cpu_percent"],
        "simulator CPU %": point.extra["simulator_cpu_percent"],
        "client CPU %": point.extra["client_cpu_percent"],
    }


def error_kinds(point: Point) -> str:
    kinds = {key.removeprefix("errors "): count for key, count in point.extra.items() if key.startswith("errors ")}
    return ", ".join(f"{kind}: {count:g}" for kind, count in kinds.items()) or "0"


def completion_row(completions: Sequence[CompletionRun]) -> dict[str, object]:
    stats = [c.stats for c in completions]
    return {
        "measurement": f"completion, {LOSS_RATE:.0%} of webhooks lost",
        "offered /s": COMPLETION_RATE,
        "tasks": sum(len(c.stats.latencies) + c.stats.errors for c in completions) // max(len(completions), 1),
        "completion p50 s": median([s.p(50) / 1000 for s in stats]),
        "completion p99 s": median([s.p(99) / 1000 for s in stats]),
        "completion max s": median([max(s.latencies, default=float("nan")) for s in stats]),
        "wall clock s": median([c.wall_seconds for c in completions]),
        "found by polling": median([c.by_polling for c in completions]),
        "ended by webhook": median([c.callbacks_applied for c in completions]),
        "lost (all runs)": sum(s.errors for s in stats),
    }


def targets(points: Sequence[Point], completions: Sequence[CompletionRun]) -> list[Target]:
    found = [
        Target(
            name=f"image submit p99 at {TARGET_RATE:g} requests/s ({point.system})",
            goal=f"<= {TARGET_P99_MS:g} ms",
            measured=f"{point.p99_ms:.1f} ms (median of {len(point.samples)} runs)",
            met=point.p99_ms <= TARGET_P99_MS,
        )
        for point in points
        if point.x == TARGET_RATE
    ]
    lost = sum(c.stats.errors for c in completions)
    total = sum(len(c.stats.latencies) + c.stats.errors for c in completions)
    outcomes = sum((c.outcomes for c in completions), Counter[str]())
    detail = ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items()) if k != "completed")
    found.append(
        Target(
            name=f"lost video tasks with {LOSS_RATE:.0%} of webhooks lost",
            goal="0",
            measured=f"{lost} of {total} over {len(completions)} runs" + (f" ({detail})" if detail else ""),
            met=lost == 0,
        )
    )
    return found


def notes(cores: int, runs: int, quick: bool) -> list[str]:
    return [
        f"{cores} CPU cores, shared by the load generator, the gateway, the Pika simulator (at nice 10, as it "
        "stands in for a remote service) and Redis; CPU %: during the load window, 100 = one core.",
        f"Medians of {runs} runs, each on a fresh simulator and gateway. Latency counts from the scheduled send "
        f"(open loop, a connection per request in flight); {WARMUP_REQUESTS} unmeasured submits warm each load.",
        f"Simulated jobs take {JOB_SECONDS[quick]:g} s; webhooks go to the gateway's own /v1/callbacks/video; "
        f"VIDEO_CALLBACK_GRACE_SECONDS={JOB_SECONDS[quick] + GRACE_AFTER_JOB_SECONDS:g} (polls only tasks whose "
        f"webhook is late), VIDEO_TASK_TIMEOUT_SECONDS={TASK_TIMEOUT_SECONDS:g}, "
        "submit quota 5000/s (16 in flight), GATEWAY_MAX_IN_FLIGHT=4096 (one SSE stream per watched task).",
        f"Completion: {COMPLETION_RATE:g} tasks/s, each watched over SSE from its send to its final event; a task is "
        f"lost unless it is completed within the task timeout + {DEADLINE_MARGIN_SECONDS:g} s (every simulated job "
        "succeeds). A fresh gateway and simulator per run (loss seed = run index).",
        *(["Quick mode: short loads; the numbers check the harness, not the stack."] if quick else []),
    ]
