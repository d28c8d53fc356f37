"""Load generators: drive a request function and time every request (`RunStats`).

`closed_loop` keeps `concurrency` requests in flight until `total` are done (throughput at a
concurrency); `open_loop` starts requests at a fixed rate whatever the answers do (latency at a load,
without the coordinated omission of a closed loop); `taking_turns` sends one request at a time to several
systems in turn (a latency difference between them, without the drift between two runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace

import aiohttp

from bench.cpu import process_cpu_seconds, settle_heap
from bench.run_stats import RunStats

log = logging.getLogger(__name__)

Request = Callable[[int], Awaitable[int]]  # request(i) sends request i and returns its work units


class _Run:
    """One measured run in progress: what its requests did so far; it starts on creation, `stats()` ends it."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors = 0
        self.items = 0
        self.busy = 0.0  # seconds spent in this run's requests, failed ones included
        settle_heap()
        self._cpu = process_cpu_seconds()
        self.started = time.perf_counter()

    async def send(self, request: Request, index: int, started: float | None = None) -> None:
        """request(index), its latency counted from `started` (default: now)."""
        started = time.perf_counter() if started is None else started
        try:
            done = await request(index)  # not `items += await ...`: that reads `items` before awaiting
        except Exception as exc:
            self.errors += 1
            if self.errors == 1:  # the first failure, so that an error count in the report has a cause in the log
                log.warning("request %d failed: %s", index, repr(exc)[:300])
            return
        finally:
            self.busy += time.perf_counter() - started
        self.items += done
        self.latencies.append(time.perf_counter() - started)

    def stats(self) -> RunStats:
        elapsed = time.perf_counter() - self.started
        return RunStats(elapsed, self.latencies, self.errors, self.items, process_cpu_seconds() - self._cpu)


async def closed_loop(request: Request, *, total: int, concurrency: int) -> RunStats:
    """Run request(i) for i in range(total) with `concurrency` in flight; each returns its work units."""
    indices = iter(range(total))
    run = _Run()

    async def worker() -> None:
        for index in indices:  # shared by the workers: each takes the next index not yet sent
            await run.send(request, index)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return run.stats()


async def open_loop(request: Request, *, rate: float, duration: float) -> RunStats:
    """Start request(i) every 1/rate s for `duration` s; latency counts from the scheduled start."""
    count = int(rate * duration)
    run = _Run()
    tasks = []
    for index in range(count):
        scheduled = run.started + index / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(run.send(request, index, scheduled)))
    await asyncio.gather(*tasks)
    return run.stats()


async def taking_turns(requests: Sequence[Request], *, total: int) -> list[RunStats]:
    """`total` requests to each of `requests`, one at a time: each index goes to every system in turn, the order
    rotated by one per index. Two systems measured in separate runs, seconds apart, differ by the machine's
    drift as well (other processes, timers, caches): a small difference between them can drown in it. Taking
    turns, they share every moment. Each run's elapsed time is the time spent in its own requests, and the load
    generator's CPU is shared out in that proportion."""
    runs = [_Run() for _ in requests]
    for index in range(total):
        for turn in range(len(requests)):
            number = (index + turn) % len(requests)
            await runs[number].send(requests[number], index)
    stats = [run.stats() for run in runs]
    wall = max((s.elapsed for s in stats), default=0.0)
    cpu = max((s.client_cpu_seconds for s in stats), default=0.0)  # each run's CPU clock covered all of them
    return [
        replace(s, elapsed=run.busy, client_cpu_seconds=cpu * run.busy / wall if wall > 0 else 0.0)
        for s, run in zip(stats, runs, strict=True)
    ]


@contextlib.asynccontextmanager
async def aiohttp_session(limit: int, timeout: float = 120.0) -> AsyncIterator[aiohttp.ClientSession]:
    """A load generator's pooled client: aiohttp, which costs less CPU per request than httpx, and that CPU
    comes out of the cores the measured systems run on. `limit` 0: no connection limit, so that a request of
    an open loop never waits in the client for another's connection (that wait would be measured as the
    server's latency)."""
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout), read_bufsize=2**20
    ) as session:
        yield session
