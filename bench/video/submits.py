"""Submit latency: `POST /v1/images/generations` in an open loop, per rate, with the CPU the gateway and the
simulator used meanwhile; one point per rate, medians over runs on fresh servers."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.load import aiohttp_session, open_loop
from bench.results import Point, summarize
from bench.run_stats import RunStats, median
from bench.video.plan import PROMPT, RATES, WARMUP_REQUESTS
from bench.video.servers import VideoStack, video_stack

log = logging.getLogger("bench.video")


@dataclass
class Measured:
    stats: RunStats
    gateway_cpu_percent: float  # during the load window; 100 = one core
    simulator_cpu_percent: float
    failures: Counter[str]  # by HTTP status or exception

    def percentiles(self) -> tuple[float, float]:
        return self.stats.p(50), self.stats.p(99)


async def submit_load(base_url: str, rate: float, duration: float) -> tuple[RunStats, Counter[str]]:
    """Open-loop submits at `rate` for `duration` s; anything but 202 is an error, counted by status or exception."""
    failures: Counter[str] = Counter()
    async with aiohttp_session(0, timeout=30.0) as session:
        url = f"{base_url}/v1/images/generations"

        async def submit(index: int) -> int:
            try:
                async with session.post(url, json={"prompt": f"{PROMPT} #{index}"}) as response:
                    status, body = response.status, await response.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                failures[type(exc).__name__] += 1
                raise
            if status != 202:
                failures[str(status)] += 1
                raise RuntimeError(f"submit answered {status}: {body[:200]!r}")
            return 1

        for index in range(WARMUP_REQUESTS):  # connections and code paths warm; not measured
            await submit(-1 - index)
        return await open_loop(submit, rate=rate, duration=duration), failures


async def submit_once(stack: VideoStack, rate: float, duration: float) -> Measured:
    """One load, with the CPU the gateway and the simulator used meanwhile."""
    before = stack.cpu_seconds()
    stats, failures = await submit_load(stack.gateway.base_url, rate, duration)
    gateway_cpu, simulator_cpu = (
        100 * (a - b) / stats.elapsed for a, b in zip(stack.cpu_seconds(), before, strict=True)
    )
    return Measured(stats, gateway_cpu, simulator_cpu, failures)


async def submit_series(
    log_dir: Path, system: str, redis_url: str | None, *, runs: int, duration: float, job_seconds: float
) -> list[Point]:
    """One point per rate: medians over `runs` runs, each on a fresh simulator and gateway (nothing left over)."""
    measured: dict[float, list[Measured]] = {rate: [] for rate in RATES}
    for run in range(runs):
        for rate in RATES:
            name = f"gateway-video-{'redis' if redis_url else 'sqlite'}-{rate:g}-{run}"
            with video_stack(log_dir, name, job_seconds=job_seconds, redis_url=redis_url, seed=run) as stack:
                measured[rate].append(one := await submit_once(stack, rate, duration))
            log.info("%s run %d at %g/s: p50 %.1f ms, p99 %.1f ms", system, run + 1, rate, *one.percentiles())
    points = []
    for rate, ones in measured.items():
        point = summarize(system, rate, [one.stats for one in ones], per="requests")
        point.extra["gateway_cpu_percent"] = median([one.gateway_cpu_percent for one in ones])
        point.extra["simulator_cpu_percent"] = median([one.simulator_cpu_percent for one in ones])
        point.extra["max_ms"] = median([max(one.stats.latencies, default=float("nan")) * 1000 for one in ones])
        failures = sum((one.failures for one in ones), Counter[str]())
        point.extra.update({f"errors {kind}": float(count) for kind, count in failures.items()})
        points.append(point)
    return points
