"""The latency sweep of one system through the API: each concurrency, without and with the filter."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from bench.processes import ServerProcess
from bench.search import api
from bench.search.api import STORE_SEARCH
from bench.search.plan import Plan
from bench.search.report import Measured

log = logging.getLogger("bench.search")


async def sweep(
    measured: Measured,
    base_url: str,
    plan: Plan,
    system: str,
    concurrencies: tuple[int, ...],
    run: int = 0,
    store_operation: str = STORE_SEARCH,
    serving: Mapping[str, ServerProcess] | None = None,
    mode: str = "dense",
) -> None:
    """The latency points of one run at each concurrency, without and with the filter, searching in `mode`, into
    `measured`; with the CPU each of the `serving` processes (by name) spent per search."""
    processes = dict(serving or {})
    for concurrency in concurrencies:
        for filtered in (False, True):
            before = {name: process.cpu_seconds() for name, process in processes.items()}
            stats, breakdown = await api.latency_point(base_url, plan, concurrency, filtered, run,
                                                       store_operation=store_operation, mode=mode)  # fmt: skip
            key = (system, concurrency, filtered)
            measured.latency.setdefault(key, []).append(stats)
            measured.breakdowns.setdefault(key, []).append(breakdown)
            searches = max(1, len(stats.latencies))
            measured.cpu.setdefault(key, []).append(
                {name: 1000 * (process.cpu_seconds() - before[name]) / searches for name, process in processes.items()}
            )
            log.info("%s @ %d%s: p50 %.1f ms, p99 %.1f ms", system, concurrency, " filter" if filtered else "",
                     stats.p(50), stats.p(99))  # fmt: skip
