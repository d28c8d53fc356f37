"""Part 3, images: how fast a generation request is accepted, and whether every task ends when webhooks get lost.

- Submit latency: `POST /v1/images/generations` (202 once the task is stored; the upstream call happens
  later) in an open loop at 50 and 200 requests/s, p50/p99 from the scheduled send to the answer. With
  the SQLite task store and, where `redis-server` is installed, the Redis one. The Pika simulator runs
  5 s jobs and sends signed webhooks, so meanwhile the gateway also submits upstream and takes callbacks.
- Completion: tasks submitted at 50/s while the simulator loses 30 % of the webhooks, each watched over
  SSE until it ends. Time to completion (send to the final event), wall clock, lost tasks (every job
  succeeds upstream, so a task not `completed` by its deadline is lost) and the tasks the gateway found
  by polling (`gateway_image_tasks_completed_by_polling_total`).

    python -m bench images [--runs 3] [--quick] [--out DIR]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import redis
from prometheus_client.parser import text_string_to_metric_families

from bench.load import aiohttp_session, open_loop
from bench.processes import running
from bench.results import PartResult, Point, Target, machine, summarize
from bench.run_stats import RunStats, median
from bench.stack import Endpoint, gateway, pika_simulator
from localtriton.ports import free_port

log = logging.getLogger("bench.images")

API_KEY = "bench-fal-key"
JOB_SECONDS = {False: 5.0, True: 1.0}  # by quick; a real Pika job takes 10-20 s, the protocol is the same
RATES = (50.0, 200.0)
LOAD_SECONDS = {False: 10.0, True: 1.0}  # per rate and run; by quick
COMPLETION_TASKS = {False: 200, True: 20}
COMPLETION_RATE = 50.0
LOSS_RATE = 0.3
GRACE_AFTER_JOB_SECONDS = 1.0  # polling starts this long after a job should have ended: lost webhooks only
TASK_TIMEOUT_SECONDS = 60.0
DEADLINE_MARGIN_SECONDS = 15.0
WARMUP_REQUESTS = 20
TARGET_RATE = 200.0
TARGET_P99_MS = 10.0
TERMINAL = ("completed", "failed", "cancelled")
PROMPT = "a paper boat drifting on a pond at dawn, soft light"


@dataclass
class ImageStack:
    pika: Endpoint
    gateway: Endpoint

    def cpu_seconds(self) -> tuple[float, float]:
        return self.gateway.server.cpu_seconds(), self.pika.server.cpu_seconds()


# -- processes ----------------------------------------------------------------------------------------


def gateway_env(pika: Endpoint, redis_url: str | None, *, job_seconds: float = JOB_SECONDS[False]) -> dict[str, str]:
    """Images only (no Triton); submit quota far above the load; polling starts soon after a lost webhook."""
    env = {
        "TRITON_URL": "127.0.0.1:9",
        "PIKA_BASE_URL": pika.base_url,
        "PIKA_API_KEY": API_KEY,
        "PIKA_WEBHOOK_JWKS_URL": f"{pika.base_url}/.well-known/jwks.json",
        "PIKA_SUBMITS_PER_SECOND": "5000",
        "PIKA_MAX_CONCURRENT_SUBMITS": "16",
        "PIKA_CALLBACK_GRACE_SECONDS": f"{job_seconds + GRACE_AFTER_JOB_SECONDS:g}",
        "PIKA_TASK_TIMEOUT_SECONDS": f"{TASK_TIMEOUT_SECONDS:g}",
        "GATEWAY_MAX_IN_FLIGHT": "4096",  # the completion run holds one SSE stream per task
        "GATEWAY_SHUTDOWN_GRACE_SECONDS": "1",  # each run stops its gateway with tasks still open
    }
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    return env


@contextlib.contextmanager
def image_stack(
    log_dir: Path,
    name: str,
    *,
    job_seconds: float = JOB_SECONDS[False],
    loss_rate: float = 0.0,
    seed: int = 0,
    redis_url: str | None = None,
) -> Iterator[ImageStack]:
    """The Pika simulator and a gateway with webhooks to itself, on free ports; stopped on exit."""
    pika = pika_simulator(
        log_dir, "--api-key", API_KEY, "--job-seconds", f"{job_seconds:g}", "--callback-loss-rate",
        f"{loss_rate:g}", "--seed", str(seed), "--log-level", "warning",
    )  # fmt: skip
    # The simulator stands in for a remote service: it must not take the gateway's share of the cores.
    pika.server.command = ["nice", "-n", "10", *pika.server.command]
    gw = gateway(log_dir, gateway_env(pika, redis_url, job_seconds=job_seconds), name=name)
    # stack.gateway picks the port, so the public URL (where webhooks go) is only known now.
    gw.server.env["GATEWAY_PUBLIC_URL"] = gw.base_url
    if redis_url is None:
        gw.server.env.pop("REDIS_URL", None)
    else:
        with redis.Redis.from_url(redis_url) as client:
            client.flushdb()  # no tasks, leases or quota left from an earlier run
    for suffix in ("", "-wal", "-shm", "-journal"):
        (log_dir / f"{name}-tasks.sqlite3{suffix}").unlink(missing_ok=True)  # no tasks left from an earlier run
    with running((pika.server, pika.ready_url), (gw.server, gw.ready_url)):
        yield ImageStack(pika, gw)


@contextlib.contextmanager
def redis_server(log_dir: Path) -> Iterator[str | None]:
    """A throwaway `redis-server` on a free port (no persistence); None when the binary is missing."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    with (log_dir / "redis.log").open("ab") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        client = redis.Redis(port=port, socket_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"redis-server not ready on port {port}; see {log_dir / 'redis.log'}") from None
                time.sleep(0.1)
        client.close()
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)


# -- gateway metrics ----------------------------------------------------------------------------------


async def scrape(session: aiohttp.ClientSession, base_url: str) -> str:
    async with session.get(f"{base_url}/metrics", raise_for_status=True) as response:
        return await response.text()


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called `name` (with the `_total` suffix of counters) whose labels include `labels`."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


# -- submit latency -----------------------------------------------------------------------------------


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


async def submit_once(stack: ImageStack, rate: float, duration: float) -> Measured:
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
            name = f"gateway-images-{'redis' if redis_url else 'sqlite'}-{rate:g}-{run}"
            with image_stack(log_dir, name, job_seconds=job_seconds, redis_url=redis_url, seed=run) as stack:
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


# -- completion with lost webhooks --------------------------------------------------------------------


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


async def completion_run(stack: ImageStack, tasks: int) -> CompletionRun:
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
        by_polling=metric(text, "gateway_image_tasks_completed_by_polling_total"),
        callbacks_applied=metric(text, "gateway_image_callbacks_total", result="applied"),
    )


# -- the part -----------------------------------------------------------------------------------------


async def run(out_dir: Path, *, runs: int = 3, quick: bool = False) -> PartResult:
    """Submit latency per task store and rate, then completion with 30 % of webhooks lost."""
    log_dir = out_dir / "logs" / "images"
    load_at_start = os.getloadavg()[0]
    cores = machine()["cores"]
    result = PartResult(part="images", x_label="requests/s offered", throughput_unit="submits/s")
    with redis_server(log_dir) as redis_url:
        stores: list[tuple[str, str | None]] = [("SQLite task store", None)]
        if redis_url is not None:
            stores.append(("Redis task store", redis_url))
        else:
            result.notes.append("Redis task store skipped: no redis-server binary on this machine.")
        for system, url in stores:
            result.points += await submit_series(
                log_dir, system, url, runs=runs, duration=LOAD_SECONDS[quick], job_seconds=JOB_SECONDS[quick]
            )
    completions = []
    for index in range(runs):
        name = f"gateway-images-loss-{index}"
        with image_stack(log_dir, name, job_seconds=JOB_SECONDS[quick], loss_rate=LOSS_RATE, seed=index) as stack:
            completions.append(await completion_run(stack, COMPLETION_TASKS[quick]))
        log.info("completion run %d: %s", index + 1, dict(completions[-1].outcomes))
    result.table = [submit_row(point) for point in result.points] + [completion_row(completions)]
    result.targets = targets(result.points, completions)
    result.notes += notes(cores, runs, quick)
    result.notes.append(load_note(load_at_start))
    return result


def submit_row(point: Point) -> dict[str, object]:
    return {
        "measurement": f"submit, {point.system}",
        "offered /s": point.x,
        "achieved /s": point.throughput,
        "p50 ms": point.p50_ms,
        "p99 ms": point.p99_ms,
        "max ms": point.extra["max_ms"],
        "errors (all runs)": error_kinds(point),
        "gateway CPU %": point.extra["gateway_cpu_percent"],
        "simulator CPU %": point.extra["simulator_cpu_percent"],
        "client CPU %": point.extra["client_cpu_percent"],
    }


def error_kinds(point: Point) -> str:
    kinds = {key.removeprefix("errors "): count for key, count in point.extra.items() if key.startswith("errors ")}
    return ", ".join(f"{kind}: {count:g}" for kind, count in kinds.items()) or "0"


def completion_row(completions: Sequence[CompletionRun]) -> dict[str, object]:
    stats = [c.stats for c in completions]
    return {
        "measurement": f"completion, {LOSS_RATE:.0%} of webhooks lost",
        "offered /s": COMPLETION_RATE,
        "tasks": sum(len(c.stats.latencies) + c.stats.errors for c in completions) // max(len(completions), 1),
        "completion p50 s": median([s.p(50) / 1000 for s in stats]),
        "completion p99 s": median([s.p(99) / 1000 for s in stats]),
        "completion max s": median([max(s.latencies, default=float("nan")) for s in stats]),
        "wall clock s": median([c.wall_seconds for c in completions]),
        "found by polling": median([c.by_polling for c in completions]),
        "ended by webhook": median([c.callbacks_applied for c in completions]),
        "lost (all runs)": sum(s.errors for s in stats),
    }


def targets(points: Sequence[Point], completions: Sequence[CompletionRun]) -> list[Target]:
    found = [
        Target(
            name=f"image submit p99 at {TARGET_RATE:g} requests/s ({point.system})",
            goal=f"<= {TARGET_P99_MS:g} ms",
            measured=f"{point.p99_ms:.1f} ms (median of {len(point.samples)} runs)",
            met=point.p99_ms <= TARGET_P99_MS,
        )
        for point in points
        if point.x == TARGET_RATE
    ]
    lost = sum(c.stats.errors for c in completions)
    total = sum(len(c.stats.latencies) + c.stats.errors for c in completions)
    outcomes = sum((c.outcomes for c in completions), Counter[str]())
    detail = ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items()) if k != "completed")
    found.append(
        Target(
            name=f"lost image tasks with {LOSS_RATE:.0%} of webhooks lost",
            goal="0",
            measured=f"{lost} of {total} over {len(completions)} runs" + (f" ({detail})" if detail else ""),
            met=lost == 0,
        )
    )
    return found


def notes(cores: int, runs: int, quick: bool) -> list[str]:
    return [
        f"{cores} CPU cores, shared by the load generator, the gateway, the Pika simulator (at nice 10, as it "
        "stands in for a remote service) and Redis; CPU %: during the load window, 100 = one core.",
        f"Medians of {runs} runs, each on a fresh simulator and gateway. Latency counts from the scheduled send "
        f"(open loop, a connection per request in flight); {WARMUP_REQUESTS} unmeasured submits warm each load.",
        f"Simulated jobs take {JOB_SECONDS[quick]:g} s; webhooks go to the gateway's own /v1/callbacks/pika; "
        f"PIKA_CALLBACK_GRACE_SECONDS={JOB_SECONDS[quick] + GRACE_AFTER_JOB_SECONDS:g} (polls only tasks whose "
        f"webhook is late), PIKA_TASK_TIMEOUT_SECONDS={TASK_TIMEOUT_SECONDS:g}, "
        "submit quota 5000/s (16 in flight), GATEWAY_MAX_IN_FLIGHT=4096 (one SSE stream per watched task).",
        f"Completion: {COMPLETION_RATE:g} tasks/s, each watched over SSE from its send to its final event; a task is "
        f"lost unless it is completed within the task timeout + {DEADLINE_MARGIN_SECONDS:g} s (every simulated job "
        "succeeds). A fresh gateway and simulator per run (loss seed = run index).",
        *(["Quick mode: short loads; the numbers check the harness, not the stack."] if quick else []),
    ]


def load_note(at_start: float) -> str:
    """The machine's 1-minute load average around the part: other work on it shows up in the latencies."""
    return (
        f"Load average (1 min) at the start / end of the part: {at_start:.1f} / {os.getloadavg()[0]:.1f} "
        f"on {len(os.sched_getaffinity(0))} cores; above the core count, other processes shared the CPUs."
    )
