"""Completion with lost webhooks: tasks submitted at a fixed rate while the simulator loses some of the
webhooks, each watched over SSE until it ends; what ended, how long it took, and how the gateway learnt."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass

import aiohttp

from bench.gateway_metrics import metric, scrape
from bench.load import aiohttp_session, open_loop
from bench.run_stats import RunStats
from bench.video.plan import COMPLETION_RATE, DEADLINE_MARGIN_SECONDS, PROMPT, TASK_TIMEOUT_SECONDS, TERMINAL
from bench.video.servers import VideoStack


@dataclass
class CompletionRun:
    stats: RunStats  # latencies: send to final event of each completed task; errors: tasks not completed
    outcomes: Counter[str]  # final status (failed: with its error code) or "unfinished" / "refused"
    wall_seconds: float  # first send to the last task's end
    by_polling: float  # tasks whose end the gateway found by polling
    callbacks_applied: float


async def final_status(session: aiohttp.ClientSession, base_url: str, task_id: str, deadline: float) -> str:
    """Watch the task's SSE stream until a final state; "unfinished" when the deadline comes first."""
    try:
        async with asyncio.timeout(max(deadline - time.perf_counter(), 0.0)):
            async with session.get(f"{base_url}/v1/tasks/{task_id}/events") as response:
                async for raw in response.content:
                    line = raw.decode("utf-8")
                    if not line.startswith("data: {"):
                        continue
                    task = json.loads(line.removeprefix("data: "))
                    if task.get("status") in TERMINAL:
                        error = task.get("error") or {}
                        return task["status"] if not error else f"{task['status']}: {error.get('code')}"
            async with session.get(f"{base_url}/v1/tasks/{task_id}") as response:  # the stream ended early
                task = await response.json()
            return str(task.get("status", "unfinished"))
    except TimeoutError:
        return "unfinished"


async def completion_run(stack: VideoStack, tasks: int) -> CompletionRun:
    """Submit `tasks` at COMPLETION_RATE and follow each to its end or to the deadline."""
    base = stack.gateway.base_url
    deadline = time.perf_counter() + tasks / COMPLETION_RATE + TASK_TIMEOUT_SECONDS + DEADLINE_MARGIN_SECONDS
    outcomes: Counter[str] = Counter()
    ended: list[float] = []
    async with aiohttp_session(0, timeout=TASK_TIMEOUT_SECONDS + 2 * DEADLINE_MARGIN_SECONDS) as session:

        async def follow(index: int) -> int:
            async with session.post(f"{base}/v1/images/generations", json={"prompt": f"{PROMPT} #{index}"}) as sent:
                accepted, answer = sent.status == 202, await sent.json() if sent.status == 202 else {}
            status = await final_status(session, base, answer["id"], deadline) if accepted else "refused"
            outcomes[status] += 1
            ended.append(time.perf_counter())
            if status != "completed":
                raise RuntimeError(status)
            return 1

        started = time.perf_counter()
        stats = await open_loop(follow, rate=COMPLETION_RATE, duration=tasks / COMPLETION_RATE)
        text = await scrape(session, base)
    return CompletionRun(
        stats=stats,
        outcomes=outcomes,
        wall_seconds=max(ended, default=started) - started,
        by_polling=metric(text, "gateway_video_tasks_completed_by_polling_total"),
        callbacks_applied=metric(text, "gateway_video_callbacks_total", result="applied"),
    )
