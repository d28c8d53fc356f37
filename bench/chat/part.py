"""The chat part's run: start the servers, measure TTFT, requests per second and streams at once, write the result."""

from __future__ import annotations

import resource
from dataclasses import replace
from pathlib import Path

from bench.chat.loads import bursts, completion_run, sweep, ttft_sweep
from bench.chat.plan import PART, QUICK, Plan
from bench.chat.report import assemble, plan_notes
from bench.chat.servers import chat_stack
from bench.results import PartResult


async def run(out_dir: Path, *, runs: int = 3, quick: bool = False) -> PartResult:
    """Measure everything (quick: tiny loads, one round, 50 streams, no LiteLLM) and write chat.json."""
    plan = QUICK if quick else replace(Plan(), runs=max(runs, 1))
    notes = plan_notes(plan)
    if (note := raise_open_files(2 * plan.streams + 512)) is not None:
        notes.append(note)
    async with chat_stack(out_dir / "logs" / PART, plan, notes) as routes:
        ttft = await ttft_sweep(routes["ttft"], plan)
        rps = await sweep(routes["rps"], plan.runs, plan.rps_concurrency, completion_run, plan.rps_seconds)
        streams = await bursts(routes["streams"], plan)
    result = assemble(plan, ttft, rps, streams, notes)
    result.write(out_dir)
    return result


def raise_open_files(needed: int) -> str | None:
    """Lift this process's soft limit on open files to `needed` (bounded by the hard limit) if it is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return None
    wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return f"client open-file limit raised from {soft} to {wanted}"
