"""The embeddings part's loads: each system's requests driven at a concurrency (or a rate), with the CPU
window and Triton's statistics around each, collected per system and setting (`Series`)."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field

from bench.cpu import CpuWindow
from bench.embeddings.clients import AiohttpSession, EmbeddingsError, TritonDirect, openai_request
from bench.embeddings.infinity import Peer
from bench.embeddings.plan import (
    BATCH,
    CACHED_1,
    GATEWAY_1,
    GATEWAY_32,
    GATEWAY_BASE64,
    TARGET_CONCURRENCY,
    Plan,
)
from bench.load import Request, closed_loop, open_loop
from bench.results import Point, summarize
from bench.run_stats import RunStats, median
from bench.stack import Endpoint
from bench.triton_stats import TritonStats


@dataclass
class Series:
    """Every run of one system at one setting, for `summarize`, plus each run's CPU window."""

    system: str
    x: float
    runs: list[RunStats] = field(default_factory=list)
    cpu: list[dict[str, float]] = field(default_factory=list)
    counters: list[dict[str, float]] = field(default_factory=list)

    def add(self, stats: RunStats, cpu: dict[str, float], counters: dict[str, float]) -> None:
        """One more run, with its CPU window's percentages and Triton's counters."""
        self.runs.append(stats)
        self.cpu.append(cpu)
        self.counters.append(counters)

    def point(self) -> Point:
        point = summarize(self.system, self.x, self.runs)
        for key in dict.fromkeys(key for window in self.cpu + self.counters for key in window):
            point.extra[key] = median([window[key] for window in self.cpu + self.counters if key in window])
        return point


def batches(texts: Sequence[str], size: int) -> list[list[str]]:
    return [list(texts[start : start + size]) for start in range(0, len(texts), size)]


async def measure(load: Awaitable[RunStats], servers: dict[str, int]) -> tuple[RunStats, CpuWindow]:
    """`load` (a `closed_loop` or an `open_loop`, not awaited yet: it starts inside the window) and the CPU
    window around it."""
    with CpuWindow(servers) as window:
        stats = await load
    return stats, window


async def warm_up(request: Request, concurrency: int) -> None:
    """`concurrency` requests (at least 4) from the end of the workload, not timed."""
    count = max(concurrency, 4)
    await closed_loop(lambda index: request(-1 - index), total=count, concurrency=concurrency)


@dataclass(frozen=True)
class RestLoad:
    """One OpenAI-compatible route driven with one request shape, and the servers whose CPU it costs."""

    system: str
    url: str
    requests: Sequence[str | list[str]]
    servers: dict[str, int]
    model: str | None = None
    encoding_format: str | None = None
    cache: bool = False  # count answers that did not come from the cache
    triton: TritonStats | None = None  # what Triton saw of the load, for loads that reach it


def rest_loads(
    concurrency: int, plan: Plan, triton: Endpoint, uncached: Endpoint, cached: Endpoint, peers: Sequence[Peer]
) -> list[RestLoad]:
    singles: list[str | list[str]] = list(plan.texts)
    groups: list[str | list[str]] = list(batches(plan.texts, BATCH))
    gateway_url, cache_url = f"{uncached.base_url}/v1/embeddings", f"{cached.base_url}/v1/embeddings"
    stack = {"gateway": uncached.server.pid, "triton": triton.server.pid}
    seen = TritonStats(triton.base_url)
    loads = [
        RestLoad(GATEWAY_1, gateway_url, singles, stack, triton=seen),
        RestLoad(GATEWAY_32, gateway_url, groups, stack, triton=seen),
        RestLoad(CACHED_1, cache_url, singles, {"gateway": cached.server.pid}, cache=True),
    ]
    if concurrency == TARGET_CONCURRENCY:  # what JSON floats cost against base64, at the target's setting
        loads.append(RestLoad(GATEWAY_BASE64, gateway_url, singles, stack, encoding_format="base64", triton=seen))
    for peer in peers:
        servers = {"infinity": peer.endpoint.server.pid}
        url = f"{peer.endpoint.base_url}/embeddings"
        loads.append(RestLoad(f"{peer.name}, 1 text/request", url, singles, servers, model=peer.model))
    return loads


async def measure_rest(load: RestLoad, concurrency: int) -> tuple[RunStats, CpuWindow, dict[str, float]]:
    """One closed loop over all of the load's requests, after an untimed warm-up."""
    session = AiohttpSession(concurrency)
    misses: list[int] = []
    try:
        request = openai_request(
            session, load.url, load.requests, model=load.model, encoding_format=load.encoding_format, misses=misses
        )
        await warm_up(request, concurrency)  # opens the connections and wakes the server outside the timing
        misses.clear()
        before = await load.triton.settled() if load.triton else None
        loop = closed_loop(request, total=len(load.requests), concurrency=concurrency)
        stats, window = await measure(loop, load.servers)
    finally:
        await session.aclose()
    counters = {"cache_misses": float(len(misses))} if load.cache else {}
    if load.triton and before is not None:
        counters |= await load.triton.since(before, stats.items, stats.elapsed)
    return stats, window, counters


async def measure_triton(
    triton: Endpoint, requests: Sequence[list[str]], concurrency: int
) -> tuple[RunStats, CpuWindow, dict[str, float]]:
    client = TritonDirect(triton.grpc_target)
    seen = TritonStats(triton.base_url)
    try:
        request = client.request(requests)
        await warm_up(request, concurrency)
        before = await seen.settled()
        loop = closed_loop(request, total=len(requests), concurrency=concurrency)
        stats, window = await measure(loop, {"triton": triton.server.pid})
    finally:
        await client.aclose()
    return stats, window, await seen.since(before, stats.items, stats.elapsed)


async def warm_cache(url: str, groups: Sequence[list[str]], headers: dict[str, str] | None = None) -> None:
    """Every text once through the cached gateway, so that the cache runs only hit."""
    session = AiohttpSession(4, headers)
    try:
        request = openai_request(session, url, groups)
        stats = await closed_loop(request, total=len(groups), concurrency=4)
    finally:
        await session.aclose()
    if stats.errors:
        raise EmbeddingsError(f"warming the cache: {stats.errors} of {len(groups)} requests failed")


async def cache_open_loop(
    url: str,
    texts: Sequence[str],
    rate: float,
    seconds: float,
    gateway_pid: int,
    *,
    headers: dict[str, str] | None = None,
    misses: list[int] | None = None,
) -> tuple[RunStats, CpuWindow]:
    """Single-text requests from the warm cache started at `rate` per second, whatever the answers do;
    `misses` gets the measured requests the cache did not answer."""
    session = AiohttpSession(256, headers)
    try:
        request = openai_request(session, url, texts, misses=misses)
        await warm_up(request, 32)
        if misses is not None:
            misses.clear()
        return await measure(open_loop(request, rate=rate, duration=seconds), {"gateway": gateway_pid})
    finally:
        await session.aclose()
