"""`python -m bench soak --minutes N [--out DIR]` (`make soak`): start the platform, measure its capacity with a
step load, drive it at 60 % of that while the fault schedule breaks it, judge the rules and write the report
(bench/results/<time>/soak/: report.md, soak.json, the plots). Every process it started is stopped on the way out:
at the end, on Ctrl-C or SIGTERM, and on failure. `--short` is the suite's version (tests/integration/soak/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pymilvus  # noqa: F401  (imported before its loggers are quieted: its import configures them)

from bench.paths import RESULTS, ROOT
from bench.soak import capacity as capacity_phase
from bench.soak.data import Corpus, labelled, synthetic
from bench.soak.faults import SHORT_SCHEDULE, Planned, full_schedule, run_schedule
from bench.soak.platform import CHAT_QUOTA, Platform, PlatformConfig
from bench.soak.processes import process_groups
from bench.soak.records import Evidence, FaultEvent, RedisMemory, Sample, parse_nginx_log, write_jsonl
from bench.soak.report import write_report
from bench.soak.rules import RECOVERY_SECONDS, judge
from bench.soak.teams import ADMIN_KEY, default_teams
from bench.soak.traffic import COLLECTION, DEFAULT_MIX, Load, parse_mix
from gateway.observability import quiet_pymilvus

log = logging.getLogger("bench.soak")


@dataclass
class Options:
    out: Path
    repository: Path = ROOT / "model_repository"
    minutes: float = 30.0  # the faulted steady load; the step load and the warm-up come before it
    replicas: int = 3
    collection_size: int = 100_000
    rate: float | None = None  # steady requests per second; None: 60 % of the measured capacity
    mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    data: Path | None = None
    seed: int = 0
    short: bool = False
    warmup_seconds: float = 30.0
    video_seconds: float = 15.0
    tail_seconds: float | None = None  # steady load after the last fault's recovery; None: a tenth, 30 s at least


def short_options(out: Path, repository: Path) -> Options:
    """The suite's version: 2 replicas, a small collection, three faults, about 2 minutes of load."""
    return Options(
        out, repository, minutes=100 / 60, replicas=2, collection_size=500, rate=6.0, short=True,
        warmup_seconds=5.0, video_seconds=3.0, tail_seconds=5.0,
    )  # fmt: skip


async def run_soak(options: Options) -> Path:
    """The whole soak; returns the report's folder."""
    if options.out.exists() and any(options.out.iterdir()):
        # Its Redis append-only file, usage stores and spools would come back: an earlier run's usage on this one's.
        raise SystemExit(f"{options.out} is not empty: a soak starts from a folder of its own")
    options.out.mkdir(parents=True, exist_ok=True)
    corpus = labelled(options.data, options.seed) if options.data else synthetic(options.seed)
    teams = default_teams()
    config = PlatformConfig(
        options.out, options.repository, replicas=options.replicas, video_seconds=options.video_seconds, teams=teams
    )
    platform = Platform(config)
    samples: list[Sample] = []
    redis_memory: list[RedisMemory] = []
    faults: list[FaultEvent] = []
    started = time.time()
    log.info("starting the platform in %s", options.out)
    try:
        await asyncio.to_thread(platform.start)
        platform.supervise()
        sampler = asyncio.get_running_loop().create_task(sample_forever(platform, samples, redis_memory))
        notes: list[str] = []
        seeding = await seed_collection(platform, options.collection_size, corpus, notes)
        load = Load(platform.base_url, corpus, teams, options.collection_size, options.mix, options.seed)
        try:
            capacity: dict[str, object] = {}
            if options.rate is None:
                await capacity_phase.settle(platform, COLLECTION, options.collection_size, notes)
                capacity = await capacity_phase.measure(load, platform)
                rate = 0.6 * float(capacity["highest_rate_held"])  # type: ignore[arg-type]
            else:
                rate = options.rate
            load.rate = max(rate, 1.0)
            log.info("steady load at %.1f requests/s", load.rate)
            await load.run(options.warmup_seconds)
            warmup_end = time.time()
            open_files = {"after the warm-up": platform.open_files()}
            seconds = 60 * options.minutes
            schedule: tuple[Planned, ...] = SHORT_SCHEDULE if options.short else full_schedule(seconds)
            # The load goes on until the last fault's recovery is over and a tenth of the time after it (the last
            # third of the gateways' lives, for the leak rule), however long the faults took.
            faults_over = asyncio.Event()

            async def faults_then_tail() -> None:
                await run_schedule(platform, schedule, faults)
                await asyncio.sleep(max(30.0, 0.1 * seconds) if options.tail_seconds is None else options.tail_seconds)
                faults_over.set()

            await asyncio.gather(load.run(seconds, until=faults_over), faults_then_tail())
            load_end = time.time()
            open_files["at the end of the load"] = platform.open_files()
            (options.out / "open-files.json").write_text(json.dumps(open_files, indent=1))
            log.info("load over; following the last video tasks")
            await load.drain(timeout=4 * options.video_seconds + 90)
            await asyncio.sleep(2.0)  # every replica's usage batch is written (0.25 s), spools replayed
            evidence = Evidence(
                load.records, faults, warmup_end, load_end, capacity=capacity,
                chat_ttft_seconds=config.chat_ttft_seconds, chat_quota=CHAT_QUOTA,
                answered_outside={"operations": seeding}, semantic_hits=load.semantic_hits,
                false_hits=load.false_hits, exact_hits=load.exact_hits, false_hit_examples=load.false_hit_examples,
            )  # fmt: skip
            await collect(platform, load, evidence, started)
        finally:
            await load.drain(timeout=0)  # interrupted: the requests in flight end before their client closes
            await load.aclose()
            sampler.cancel()
    finally:
        await asyncio.to_thread(platform.stop)
    evidence.samples, evidence.redis_memory = samples, redis_memory
    evidence.nginx = parse_nginx_log(options.out / "nginx-access.log")
    write_jsonl(options.out / "records.jsonl", evidence.records)
    write_jsonl(options.out / "faults.jsonl", evidence.faults)
    write_jsonl(options.out / "samples.jsonl", samples)
    write_jsonl(options.out / "redis-memory.jsonl", redis_memory)
    slos, phases = judge(evidence)
    write_report(
        options.out,
        evidence,
        slos,
        phases,
        {"restarts": platform.restarts, "notes": notes, "options": _described(options)},
    )
    return options.out


def _described(options: Options) -> dict[str, object]:
    return {key: str(value) if isinstance(value, Path) else value for key, value in vars(options).items()}


async def sample_forever(
    platform: Platform, samples: list[Sample], redis_memory: list[RedisMemory], every: float = 2.0
) -> None:
    """RSS, open files and CPU of every process group, and Redis' memory, every `every` seconds (read in a
    thread: the load generator's loop must not wait on /proc or a paused Redis)."""
    while True:
        processes, memory = await asyncio.to_thread(read_samples, platform)
        samples.extend(processes)
        if memory is not None:
            redis_memory.append(memory)
        await asyncio.sleep(every)


def read_samples(platform: Platform) -> tuple[list[Sample], RedisMemory | None]:
    now, groups, read = time.time(), process_groups(), []
    for process in list(platform.started):
        members = groups.get(process.pid or -1, []) if process.alive() else []
        rss, fds, cpu = process.rss_bytes(members), process.open_fds(), process.cpu_seconds(members)
        port = platform.http_port(process)
        balancer = process.connections_on(port) if port is not None else 0
        if rss is not None and process.pid is not None:
            read.append(Sample(now, process.name, process.pid, rss, fds or 0, cpu or 0.0, balancer))
    memory = platform.redis_memory()
    return read, None if memory is None else RedisMemory(now, *memory)


async def seed_collection(platform: Platform, size: int, corpus: Corpus, notes: list[str]) -> int:
    """The collection searched, `size` seeded documents, written through the API in batches (the operator's key);
    returns the upsert requests, which the usage record holds. Waits until every replica sees the new collection
    (noted in the report when that is not at once)."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=platform.base_url, headers=headers, timeout=300) as client:
        response = await client.post("/v1/collections", json={"name": COLLECTION})
        if response.status_code not in (201, 409):
            raise RuntimeError(f"creating the collection answered {response.status_code}: {response.text[:300]}")
        created = time.monotonic()
        for port in platform.gateway_ports:
            while (await client.get(f"http://127.0.0.1:{port}/v1/collections/{COLLECTION}")).status_code == 404:
                if time.monotonic() - created > 120:
                    raise RuntimeError(f"the collection is still unknown to the replica on port {port} after 120 s")
                await asyncio.sleep(0.2)
        if (waited := time.monotonic() - created) > 0.5:
            notes.append(f"a new collection was unknown to another replica (404) for {waited:.1f} s after its create")
        batch = 500
        semaphore = asyncio.Semaphore(2)

        async def write(first: int) -> None:
            documents = []
            for number in range(first, min(first + batch, size)):
                document_id, text, metadata = corpus.document(number)
                documents.append({"id": document_id, "text": text, "metadata": metadata})
            async with semaphore:
                response = await client.post(f"/v1/collections/{COLLECTION}/documents", json={"documents": documents})
            if response.status_code != 200:
                raise RuntimeError(f"seeding answered {response.status_code}: {response.text[:300]}")

        started = time.monotonic()
        await asyncio.gather(*(write(first) for first in range(0, size, batch)))
        log.info("seeded %d documents in %.0f s", size, time.monotonic() - started)
        return len(range(0, size, batch))


async def collect(platform: Platform, load: Load, evidence: Evidence, started: float) -> None:
    """What the rules need from the platform once the load is over: the usage record, the documents, the
    upstreams' counts."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    first, last = time.strftime("%Y-%m-%d", time.gmtime(started)), time.strftime("%Y-%m-%d", time.gmtime())
    async with httpx.AsyncClient(base_url=platform.base_url, headers=headers, timeout=60) as client:
        response = await client.get("/v1/usage", params={"start": first, "end": last, "group_by": "team"})
        response.raise_for_status()
        for row in response.json()["data"]:
            evidence.usage_by_team[row["team"]] = evidence.usage_by_team.get(row["team"], 0) + int(row["requests"])
        acknowledged = sorted(set(load.live_documents) - load.uncertain_documents)
        for document_id in acknowledged:
            found = await client.get(f"/v1/collections/{COLLECTION}/documents/{document_id}")
            if found.status_code != 200:
                evidence.missing_documents.append(document_id)
        evidence.checked_documents = len(acknowledged)
    evidence.video_status = {task.id: task.status for task in load.videos.values()}
    evidence.video_prompts = {task.id: task.prompt for task in load.videos.values()}
    pika = await platform.simulator_stats(platform.pika)
    evidence.upstream_submissions = dict(pika.get("submitted_by_prompt", {}))  # type: ignore[call-overload]
    hunyuan = await platform.simulator_stats(platform.hunyuan)
    evidence.chat_upstream = (chat_peak(hunyuan, evidence.faults), int(hunyuan.get("max_in_flight", 0)))  # type: ignore[call-overload]


def chat_peak(stats: dict[str, object], faults: list[FaultEvent]) -> int:
    """The most chat calls the upstream saw in any 1 s, outside Redis' faults and their recoveries (there the
    quota is per replica by design). The simulator's monotonic clock is this machine's, as is ours."""
    offset = time.time() - time.monotonic()
    excluded = [
        (fault.start - offset, fault.end - offset + RECOVERY_SECONDS["redis"])
        for fault in faults
        if fault.component == "redis"
    ]
    times = stats.get("arrival_times", [])
    assert isinstance(times, list)
    arrivals = sorted(moment for moment in times if not any(a <= moment <= b for a, b in excluded))
    peak, first = 0, 0
    for index, moment in enumerate(arrivals):
        while arrivals[first] <= moment - 1.0:
            first += 1
        peak = max(peak, index - first + 1)
    return peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--minutes", type=float, default=30.0, help="minutes of faulted steady load (default 30)")
    add("--out", type=Path, default=None, help="report folder (default bench/results/<time>/soak)")
    add("--repository", type=Path, default=ROOT / "model_repository", help="exported model repository (make export)")
    add("--replicas", type=int, default=3, help="gateway replicas behind nginx (default 3)")
    add("--collection-size", type=int, default=100_000, help="seeded documents in the searched collection")
    add("--rate", type=float, default=None, help="steady requests/s (default: 60 %% of the step load's capacity)")
    add(
        "--mix",
        type=parse_mix,
        default=dict(DEFAULT_MIX),
        help="e.g. embeddings=40,search=25,chat=20,video=5,writes=10",
    )
    add(
        "--data", type=Path, default=None, help="folder with en/mrpc_test.tsv, zh/lcqmc_test.tsv (labelled paraphrases)"
    )
    add("--seed", type=int, default=0)
    add("--short", action="store_true", help="the suite's version: 2 replicas, 3 faults, about 3 minutes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    quiet_pymilvus()  # the readiness probe's refused connections
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = args.out or RESULTS / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) / "soak"
    if args.short:
        options = short_options(out, args.repository)
    else:
        options = Options(
            out, args.repository, minutes=args.minutes, replicas=args.replicas, collection_size=args.collection_size,
            rate=args.rate, mix=args.mix, data=args.data, seed=args.seed,
        )  # fmt: skip
    try:
        asyncio.run(_cancellable(run_soak(options)))
    except asyncio.CancelledError:
        print("interrupted: every process the soak started is stopped", file=sys.stderr)
        return 130
    print((out / "report.md").read_text())
    print(f"written: {out}")
    return 0


async def _cancellable(work: Coroutine[Any, Any, Path]) -> None:
    """Run `work`; SIGINT and SIGTERM cancel it, which unwinds it through the platform's stop."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, task.cancel)
    await task
