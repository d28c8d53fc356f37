"""The video part's run: submit latency per task store and rate, then completion with webhooks lost."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from bench.results import PartResult, load_note, machine
from bench.stack import redis_server
from bench.video.completion import CompletionRun, completion_run
from bench.video.plan import COMPLETION_TASKS, JOB_SECONDS, LOAD_SECONDS, LOSS_RATE, PART
from bench.video.report import completion_row, notes, submit_row, targets
from bench.video.servers import video_stack
from bench.video.submits import submit_series

log = logging.getLogger("bench.video")


async def run(out_dir: Path, *, runs: int = 3, quick: bool = False) -> PartResult:
    """Submit latency per task store and rate, then completion with 30 % of webhooks lost."""
    log_dir = out_dir / "logs" / PART
    load_at_start = os.getloadavg()[0]
    cores = machine()["cores"]
    result = PartResult(part=PART, x_label="requests/s offered", throughput_unit="submits/s")
    with redis_server(log_dir) as redis_url:
        stores: list[tuple[str, str | None]] = [("SQLite task store", None)]
        if redis_url is not None:
            stores.append(("Redis task store", redis_url))
        else:
            result.notes.append("Redis task store skipped: no redis-server binary on this machine.")
        for system, url in stores:
            result.points += await submit_series(
                log_dir, system, url, runs=runs, duration=LOAD_SECONDS[quick], job_seconds=JOB_SECONDS[quick]
            )
    completions: list[CompletionRun] = []
    for index in range(runs):
        name = f"gateway-video-loss-{index}"
        with video_stack(log_dir, name, job_seconds=JOB_SECONDS[quick], loss_rate=LOSS_RATE, seed=index) as stack:
            completions.append(await completion_run(stack, COMPLETION_TASKS[quick]))
        log.info("completion run %d: %s", index + 1, dict(completions[-1].outcomes))
    result.table = [submit_row(point) for point in result.points] + [completion_row(completions)]
    result.targets = targets(result.points, completions)
    result.notes += notes(cores, runs, quick)
    result.notes.append(load_note(load_at_start))
    return result
