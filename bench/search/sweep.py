"""The latency sweep of one system through the API: each concurrency, without and with the filter."""

from __future__ import annotations

import logging

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
) -> None:
    """The latency points of one run at each concurrency, without and with the filter, into `measured`."""
    for concurrency in concurrencies:
        for filtered in (False, True):
            stats, breakdown = await api.latency_point(base_url, plan, concurrency, filtered, run,
                                                       store_operation=store_operation)  # fmt: skip
            measured.latency.setdefault((system, concurrency, filtered), []).append(stats)
            measured.breakdowns.setdefault((system, concurrency, filtered), []).append(breakdown)
            log.info("%s @ %d%s: p50 %.1f ms, p99 %.1f ms", system, concurrency, " filter" if filtered else "",
                     stats.p(50), stats.p(99))  # fmt: skip
