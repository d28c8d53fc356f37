"""The embeddings part's run: start the servers, measure every system in alternating rounds, write the result."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.cpu import CpuWindow
from bench.embeddings.infinity import INFINITY_ENGINES, Peer, start_infinity
from bench.embeddings.inprocess import InProcess
from bench.embeddings.loads import (
    Series,
    batches,
    cache_open_loop,
    measure_rest,
    measure_triton,
    rest_loads,
    warm_cache,
)
from bench.embeddings.overload import FACTOR as OVERLOAD_FACTOR
from bench.embeddings.overload import overload
from bench.embeddings.plan import (
    BATCH,
    CACHED_OPEN_LOOP,
    CEILING_BATCHES,
    GATEWAY_1,
    GATEWAY_32,
    NAIVE,
    ORT_ARRIVAL,
    ORT_ONE_CALL,
    ORT_SIDE_BY_SIDE,
    PART,
    ST_BATCHED,
    TOKENIZE_COALESCED,
    TOKENIZE_PER_REQUEST,
    TRITON_1,
    TRITON_32,
    Plan,
)
from bench.embeddings.report import build_result
from bench.embeddings.repository import checkpoint_for, require_export
from bench.processes import ServerProcess, stopped_on_exit
from bench.progress import PartProgress
from bench.results import PartResult
from bench.run_stats import RunStats
from bench.stack import REPOSITORY, Endpoint, gateway, start_triton

log = logging.getLogger("bench.embeddings")


async def run(
    out_dir: Path,
    *,
    runs: int = 3,
    quick: bool = False,
    repository: Path = REPOSITORY,
    model: str | None = None,
    infinity: bool = True,
    progress: PartProgress | None = None,
) -> PartResult:
    """Measure every system `runs` times, alternating, and return the medians, table and targets; `progress`
    hears of each round."""
    began = time.monotonic()
    plan = Plan.make(runs=runs, quick=quick, infinity=infinity)
    require_export(repository)
    checkpoint = checkpoint_for(repository, model)
    log_dir = out_dir / "logs" / PART
    notes = [
        f"cores used: {len(os.sched_getaffinity(0))}; model {checkpoint.name} ({checkpoint.path}); "
        f"{len(plan.texts)} texts (half English, half Chinese, 5 to 60 words); medians of {plan.runs} "
        f"alternating runs; client: asyncio + aiohttp (REST), tritonclient.grpc.aio (Triton)",
        f"naive loop timed on the first {plan.naive_texts} texts; in-process systems run in the bench process",
        f"load average at start: {' '.join(f'{value:.1f}' for value in os.getloadavg())}",
    ]
    servers: list[ServerProcess] = []
    with stopped_on_exit(servers):
        triton_endpoint = start_triton(log_dir, servers, repository)
        # The sweep's closed loops measure throughput at saturation (up to 32 requests of 32 texts waiting): its
        # gateway's queue is not bounded, the overload step's gateway (`overload`) has the default bound.
        unbounded = {"TRITON_MAX_QUEUE_SECONDS": "3600"}
        uncached = gateway(log_dir, {"TRITON_URL": triton_endpoint.grpc_target, "EMBEDDING_CACHE_MB": "0", **unbounded})
        servers.append(uncached.server)
        uncached.server.start(uncached.ready_url)
        cached = gateway(
            log_dir, {"TRITON_URL": triton_endpoint.grpc_target, "EMBEDDING_CACHE_MB": "256"}, "gateway-cache"
        )
        servers.append(cached.server)
        cached.server.start(cached.ready_url)
        peers: list[Peer] = []
        infinity_notes: list[str] = []
        if plan.infinity:
            for engine in INFINITY_ENGINES:
                peer = start_infinity(engine, checkpoint, log_dir, infinity_notes)
                if peer is not None:
                    servers.append(peer.endpoint.server)
                    peers.append(peer)
            notes.append("infinity-emb engines that started: " + (", ".join(p.name for p in peers) or "none"))
        else:
            infinity_notes.append("infinity-emb not run (quick mode or --no-infinity)")
        notes += infinity_notes
        in_process = InProcess(repository, checkpoint.path)

        def write(series: Sequence[Series], opened: Series, tokenizers: Sequence[Series], rounds: int) -> PartResult:
            """The result so far, written after every round (which the run's bar counts): a stopped run still
            leaves its numbers."""
            done = [] if rounds == plan.runs else [f"partial: {rounds} of {plan.runs} rounds done"]
            ending = [
                f"load average at end: {' '.join(f'{value:.1f}' for value in os.getloadavg())}",
                f"embeddings part took {time.monotonic() - began:.0f} s",
            ]
            result = build_result(series, opened, plan.cache_rate, [*notes, *done, *ending], infinity_notes, tokenizers)
            result.write(out_dir)
            if progress is not None:
                progress.advance()
            return result

        try:
            result = await measure_rounds(plan, in_process, triton_endpoint, uncached, cached, peers, write)
            capacity = max((p.throughput for p in result.points if p.system in (GATEWAY_1, GATEWAY_32)), default=0.0)
            if capacity > 0:
                log.info("overload: %g x the %.0f texts/s served at best", OVERLOAD_FACTOR, capacity)
                bounded = gateway(log_dir, {"TRITON_URL": triton_endpoint.grpc_target, "EMBEDDING_CACHE_MB": "0"},
                                  "gateway-bounded")  # fmt: skip
                servers.append(bounded.server)
                bounded.server.start(bounded.ready_url)
                measured = await overload(
                    f"{bounded.base_url}/v1/embeddings", plan.texts, capacity, plan.overload_seconds
                )
                result.targets += measured.targets()
                result.notes.append(measured.note())
                result.write(out_dir)
            return result
        except Exception:
            for server in servers:  # a server that died is the cause to report, not the request that found it
                server.check_alive()
            raise
        finally:
            in_process.close()


async def measure_rounds(
    plan: Plan,
    in_process: InProcess,
    triton_endpoint: Endpoint,
    uncached: Endpoint,
    cached: Endpoint,
    peers: Sequence[Peer],
    write: Callable[[Sequence[Series], Series, Sequence[Series], int], PartResult],
) -> PartResult:
    """`plan.runs` rounds; each round measures every system at every concurrency once, in turn,
    then the result so far is written."""
    texts = plan.texts
    series: dict[tuple[str, float], Series] = {}
    opened = Series(CACHED_OPEN_LOOP, plan.cache_rate)
    tokenizers = {system: Series(system, 1) for system in (TOKENIZE_COALESCED, TOKENIZE_PER_REQUEST)}

    def record(system: str, x: float, stats: RunStats, window: CpuWindow, counters: dict[str, float]) -> None:
        series.setdefault((system, x), Series(system, x)).add(stats, window.percent, counters)
        log.info(
            "%s @ %g: %.0f texts/s, p99 %.1f ms, errors %d",
            system, x, stats.items_per_second, stats.p(99), stats.errors,
        )  # fmt: skip

    await warm_cache(f"{cached.base_url}/v1/embeddings", batches(texts, BATCH))
    in_process.warm_up(texts[: 2 * max(CEILING_BATCHES)])
    for round_number in range(plan.runs):
        log.info("round %d of %d", round_number + 1, plan.runs)
        for system, function, subset in (
            (NAIVE, in_process.naive, texts[: plan.naive_texts]),
            (ST_BATCHED, in_process.st_batched, texts),
        ):
            with CpuWindow({}) as window:
                stats = function(subset)
            record(system, 1, stats, window, {})
        for batch in CEILING_BATCHES:  # every configuration of the ceiling, and the bound, same texts, same round
            for name, configuration in (
                (ORT_ONE_CALL, in_process.ort_one_call),
                (ORT_SIDE_BY_SIDE, in_process.ort_side_by_side),
                (ORT_ARRIVAL, in_process.ort_arrival_order),
            ):
                with CpuWindow({}) as window:
                    stats = configuration(texts, batch)
                record(name.format(batch=batch), 1, stats, window, {})
        for system, tokenize in (
            (TOKENIZE_COALESCED, in_process.tokenize_coalesced),
            (TOKENIZE_PER_REQUEST, in_process.tokenize_per_request),
        ):
            with CpuWindow({}) as window:
                stats = tokenize(texts)
            tokenizers[system].add(stats, window.percent, {})
        for concurrency in plan.concurrencies:
            for load in rest_loads(concurrency, plan, triton_endpoint, uncached, cached, peers):
                stats, window, counters = await measure_rest(load, concurrency)
                record(load.system, concurrency, stats, window, counters)
            for system, requests in ((TRITON_1, batches(texts, 1)), (TRITON_32, batches(texts, BATCH))):
                stats, window, counters = await measure_triton(triton_endpoint, requests, concurrency)
                record(system, concurrency, stats, window, counters)
            for server in (triton_endpoint.server, uncached.server, cached.server):
                server.check_alive()
        url = f"{cached.base_url}/v1/embeddings"
        stats, window = await cache_open_loop(url, texts, plan.cache_rate, plan.cache_seconds, cached.server.pid)
        opened.add(stats, window.percent, {})
        log.info("cache open loop at %g/s: p99 %.2f ms, errors %d", plan.cache_rate, stats.p(99), stats.errors)
        result = write(list(series.values()), opened, list(tokenizers.values()), round_number + 1)
    return result
