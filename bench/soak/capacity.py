"""The step-load phase, run before the steady load and never judged: the rate rises step by step until a latency
SLO breaks (or more than 1 % of requests fail) in two steps in a row at the same rate; the highest rate held sets
the steady rate (60 % of it). Each step also reports the CPU each process spent per request, from the processes'
own counters, which names the first resource to run out. It starts on a settled platform: Milvus has indexed the
seeded collection and its CPU is quiet again (an index build on the same cores would be measured as the platform's
capacity)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from bench.milvus_standalone import milvus_index_progress
from bench.soak.platform import Platform
from bench.soak.processes import process_groups
from bench.soak.records import Record
from bench.soak.rules import LATENCY_GOALS_MS, percentile
from bench.soak.traffic import Load

FIRST_RATE = 4.0  # requests per second
GROWTH = 1.5
STEP_SECONDS = 20.0
MAX_STEPS = 10
QUIET_CORES = 0.25  # the platform is settled when no process uses more than this between two readings 5 s apart
QUIET_READINGS = 6  # ... in this many readings in a row (Milvus compacts and indexes again after a quiet spell)
SETTLE_TIMEOUT_SECONDS = 900.0
FINISH_SECONDS = 10.0  # a step's requests get this long after it to answer (chat: 1-5 s); later ones failed
FOLLOWING = ("video_watch",)  # a task's event stream lasts the job (10-20 s): not a request of the step's rate
INDEX_TIMEOUT_SECONDS = 300.0  # a small collection's rows may stay in growing segments (no flush): not waited for

log = logging.getLogger("bench.soak")


def cpu_by_process(platform: Platform) -> dict[str, float]:
    groups = process_groups()
    readings = {process.name: process.cpu_seconds(groups.get(process.pid or -1, [])) for process in platform.started}
    return {name: value for name, value in readings.items() if value is not None}


async def _answered(records: list[Record], timeout: float) -> None:
    """Wait (the load paused) until every request of `records` has its answer or error, at most `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(r.latency == 0 and not r.error for r in records):
        await asyncio.sleep(0.1)


async def settle(platform: Platform, collection: str, rows: int, notes: list[str]) -> None:
    """Wait until Milvus has indexed `rows` rows of `collection` and no process of the platform is busy (segments
    merged, their indexes built), at most SETTLE_TIMEOUT_SECONDS; a report note says how long it took."""
    started = time.monotonic()
    deadline = started + SETTLE_TIMEOUT_SECONDS
    progress = None
    while time.monotonic() < started + INDEX_TIMEOUT_SECONDS:
        progress = await asyncio.to_thread(milvus_index_progress, platform.milvus_uri, collection)
        if progress is not None and progress[0] >= rows:
            break
        await asyncio.sleep(5.0)
    indexed = time.monotonic() - started
    before, quiet = cpu_by_process(platform), 0
    while time.monotonic() < deadline and quiet < QUIET_READINGS:
        await asyncio.sleep(5.0)
        after = cpu_by_process(platform)
        busy = {name: (after[name] - before[name]) / 5.0 for name in after if name in before}
        quiet = quiet + 1 if all(cores < QUIET_CORES for cores in busy.values()) else 0
        before = after
    waited = time.monotonic() - started
    state = "settled" if time.monotonic() < deadline else "still busy after the timeout"
    notes.append(
        f"before the step load: Milvus indexed {progress[0] if progress else 'an unknown number of'} of {rows} seeded "
        f"rows in {indexed:.0f} s; the platform was {state} after {waited:.0f} s"
    )
    log.info("%s", notes[-1])


async def measure(load: Load, platform: Platform) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    held = 0.0
    rate = FIRST_RATE
    first_exhausted = "none: the last step still held"
    retried = False
    for _ in range(MAX_STEPS + 1):
        load.rate = rate
        before, started, count_before = cpu_by_process(platform), time.time(), len(load.records)
        await load.run(STEP_SECONDS)
        elapsed = time.time() - started
        after = cpu_by_process(platform)
        records = [r for r in load.records[count_before:] if r.start >= started and r.route not in FOLLOWING]
        await _answered(records, FINISH_SECONDS)  # else a chat still streaming would count as failed
        cores = {name: (after[name] - before[name]) / elapsed for name in after if name in before}
        step: dict[str, Any] = {"rate": rate, "requests": len(records), "p99_ms": {}, "cores": cores}
        broken = []
        for group, (routes, goal) in LATENCY_GOALS_MS.items():
            values = [1000 * r.latency for r in records if r.route in routes and r.status < 300 and not r.error]
            p99 = percentile(values, 99)
            step["p99_ms"][group] = round(p99, 1) if values else None
            if values and p99 > goal:
                broken.append(f"{group} p99 {p99:.0f} ms > {goal:.0f} ms")
        failed = sum(1 for r in records if r.failed)
        step["failed"] = failed
        if records and failed > 0.01 * len(records):
            broken.append(f"{failed} of {len(records)} failed")
        step["cpu_ms_per_request"] = {
            name: round(1000 * used * elapsed / max(1, len(records)), 2) for name, used in cores.items()
        }
        steps.append(step)
        if broken and not retried:  # a break must show twice: one slow moment (a Milvus compaction) is no limit
            retried = True
            continue
        if broken:
            busiest = max(cores, key=lambda name: cores[name]) if cores else "n/a"
            first_exhausted = (
                f"{'; '.join(broken)} at {rate:.1f}/s; busiest process {busiest} ({cores.get(busiest, 0):.2f} cores)"
            )
            break
        held, retried = rate, False
        rate *= GROWTH
    # The requests still running (video tasks followed to their end) go on into the steady phase: draining them
    # here would cancel the following, and a video task followed by no one reads as lost.
    return {"highest_rate_held": held or FIRST_RATE / GROWTH, "first_exhausted": first_exhausted, "steps": steps}
