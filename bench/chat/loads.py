"""The chat part's loads: streamed and non-streamed runs through a route (`Sample`: their statistics and the
CPU the route's servers spent), swept over concurrencies or opened all at once, in rotated rounds; streams at
concurrency 1 through every route taking turns."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import aiohttp

from bench.chat.clients import Probe
from bench.chat.plan import Plan, run_size
from bench.chat.routes import Route
from bench.load import aiohttp_session, closed_loop, taking_turns
from bench.run_stats import RunStats

log = logging.getLogger("bench.chat")


@dataclass
class Sample:
    """One run of one route: its load statistics and the CPU its servers spent meanwhile."""

    stats: RunStats
    proxy_cpu: float = 0.0
    upstream_cpu: float = 0.0
    counts: dict[str, float] = field(default_factory=dict)
    failures: Counter[str] = field(default_factory=Counter)
    first_byte: list[float] = field(default_factory=list)  # streams: seconds to the first event, per request

    def first_byte_stats(self) -> RunStats:
        return RunStats(self.stats.elapsed, self.first_byte)


Results = dict[int, dict[str, list[Sample]]]  # concurrency -> system -> one sample per round
RunFunction = Callable[[aiohttp.ClientSession, Route, int, int], Awaitable[Sample]]


async def measured(route: Route, load: Awaitable[RunStats], probe: Probe) -> Sample:
    """`load`'s statistics and the CPU the route's proxy and simulator spent while it ran."""
    proxy, upstream = route.cpu()
    stats = await load
    proxy_after, upstream_after = route.cpu()
    return Sample(stats, proxy_after - proxy, upstream_after - upstream, failures=probe.failures)


async def stream_run(client: aiohttp.ClientSession, route: Route, total: int, concurrency: int) -> Sample:
    """Streamed requests; the sample's latencies are times to the first answer token (content), its
    `first_byte` times to the first event, of completed streams only."""
    probe = Probe(client, route)
    sample = await measured(route, closed_loop(probe.stream, total=total, concurrency=concurrency), probe)
    sample.stats = replace(sample.stats, latencies=probe.ttfts)
    sample.first_byte = probe.ttfbs
    sample.counts = {"opened": total, "completed": len(probe.ttfts), "peak_open": probe.peak_open}
    return sample


async def streams_taking_turns(client: aiohttp.ClientSession, routes: Sequence[Route], total: int) -> list[Sample]:
    """`total` streamed requests per route at concurrency 1, the routes taking turns request by request, one
    sample per route as `stream_run` makes it. The routes share one simulator: its CPU is shared out in
    proportion to the time spent in each route's requests."""
    probes = [Probe(client, route) for route in routes]
    before = [route.cpu() for route in routes]
    runs = await taking_turns([probe.stream for probe in probes], total=total)
    busy = sum(run.elapsed for run in runs)
    samples = []
    for probe, run, (proxy, upstream), (proxy_after, upstream_after) in zip(
        probes, runs, before, [route.cpu() for route in routes], strict=True
    ):
        upstream_share = (upstream_after - upstream) * run.elapsed / busy if busy > 0 else 0.0
        sample = Sample(replace(run, latencies=probe.ttfts), proxy_after - proxy, upstream_share)
        sample.failures, sample.first_byte = probe.failures, probe.ttfbs
        sample.counts = {"opened": total, "completed": len(probe.ttfts), "peak_open": probe.peak_open}
        samples.append(sample)
    return samples


async def completion_run(client: aiohttp.ClientSession, route: Route, total: int, concurrency: int) -> Sample:
    """Non-streamed requests; counts the answers the gateway marked `X-Cache: hit`."""
    probe = Probe(client, route)
    sample = await measured(route, closed_loop(probe.complete, total=total, concurrency=concurrency), probe)
    sample.counts = {"cache_hit_ratio": probe.hits / max(total, 1)}
    return sample


def rotated(routes: Sequence[Route], shift: int) -> list[Route]:
    shift %= max(len(routes), 1)
    return [*routes[shift:], *routes[:shift]]


async def rounds(
    routes: Sequence[Route], runs: int, one: Callable[[Route], Awaitable[Sample]]
) -> dict[str, list[Sample]]:
    """`runs` rounds, each running every route once, in an order rotated by one per round."""
    samples: dict[str, list[Sample]] = {route.system: [] for route in routes}
    for index in range(runs):
        for route in rotated(routes, index):
            sample = await one(route)
            stats = sample.stats
            log.info("%s: %.1f requests/s, p50 %.2f ms", route.system, stats.requests_per_second, stats.p(50))
            samples[route.system].append(sample)
    return samples


async def sweep(
    routes: Sequence[Route],
    runs: int,
    concurrencies: Sequence[int],
    run_one: RunFunction,
    seconds: float,
    minimum: int = 0,
) -> Results:
    """At each concurrency: a warm-up run per route (connections, first calls, the cached route's cache),
    which also sizes that route's runs to about `seconds`; then the rounds."""
    results: Results = {}
    for concurrency in concurrencies:
        log.info("%s at concurrency %d", getattr(run_one, "__name__", "run"), concurrency)
        async with aiohttp_session(concurrency) as client:
            sizes: dict[str, int] = {}
            for route in routes:
                warm = await run_one(client, route, max(20, 4 * concurrency), concurrency)
                sizes[route.system] = run_size(warm.stats.requests_per_second, seconds, concurrency, minimum)
            results[concurrency] = await rounds(routes, runs, partial(_sized, run_one, client, sizes, concurrency))
    return results


async def ttft_sweep(routes: Sequence[Route], plan: Plan) -> Results:
    """Streams at each of the plan's TTFT concurrencies. At 1 the routes take turns request by request, so a
    proxy's added time is not blurred by the drift between two runs seconds apart (at concurrency 1 that
    drift is as large as the proxy's cost); above 1 each route runs on its own, as `sweep` runs them, since
    taking turns would split the concurrency between the systems."""
    results = await sweep(
        routes,
        plan.runs,
        [c for c in plan.ttft_concurrency if c != 1],
        stream_run,
        plan.ttft_seconds,
        plan.ttft_min_requests,
    )
    if 1 not in plan.ttft_concurrency:
        return results
    log.info("streams at concurrency 1, the routes taking turns")
    async with aiohttp_session(1) as client:
        rates = [(await stream_run(client, route, 20, 1)).stats.requests_per_second for route in routes]  # warm-up
        total = run_size(min(rates), plan.ttft_seconds, 1, plan.ttft_min_requests)
        by_system: dict[str, list[Sample]] = {route.system: [] for route in routes}
        for _ in range(plan.runs):
            for route, sample in zip(routes, await streams_taking_turns(client, routes, total), strict=True):
                log.info("%s: p50 %.2f ms", route.system, sample.stats.p(50))
                by_system[route.system].append(sample)
    return {1: by_system, **results}


async def _sized(
    run_one: RunFunction, client: aiohttp.ClientSession, sizes: Mapping[str, int], concurrency: int, route: Route
) -> Sample:
    return await run_one(client, route, sizes[route.system], concurrency)


async def bursts(routes: Sequence[Route], plan: Plan) -> dict[str, list[Sample]]:
    """`plan.streams` streams opened at once per route and round (no warm-up: keep-alive expires between
    bursts anyway, so every burst opens its connections)."""
    log.info("%d streams at once", plan.streams)
    async with aiohttp_session(plan.streams) as client:
        return await rounds(
            routes, plan.runs, partial(stream_run, client, total=plan.streams, concurrency=plan.streams)
        )
