"""Chat proxy cost: the gateway in front of the Hunyuan simulator, against the bare simulator and LiteLLM.

All systems run in one session against the same simulators; every round runs each system once, in an
order rotated by one per round, and each figure is the median over `runs` rounds.

- Added time to first token: streamed requests, timed at the client to the first chunk with content,
  through a proxy minus straight to the simulator at the same concurrency. The simulator's own TTFT is
  fixed (50 ms), so the difference is the proxy's cost. Added p50 (p99) is the proxy's p50 (p99) minus
  the bare simulator's p50 (p99) of the same round: a difference of percentiles, not a percentile of
  differences.
- Requests per second: small non-streamed completions against an unpaced simulator, closed loop at each
  concurrency; uncached (every prompt unique, exact cache off) for every system, and exact-cache hits for
  the gateway (one request repeated, cache on). Semantic cache off throughout.
- Concurrent streams held: N streams (1,000) opened at once, each lasting about 10 s; how many end with
  [DONE] and no error event, how many were open at the same moment, and their added TTFT against the bare
  simulator under the same burst.

    python -m bench chat [--runs 3] [--quick] [--out DIR]
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import resource
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from bench.load import aiohttp_session, closed_loop
from bench.peer_venvs import venv_python
from bench.processes import ServerProcess
from bench.results import PartResult, Point, Target, machine, summarize
from bench.run_stats import RunStats, median
from bench.stack import Endpoint, gateway, hunyuan_simulator
from localtriton.ports import free_port
from simulators.hunyuan import echo_reply, split_pieces

log = logging.getLogger("bench.chat")

LITELLM_REQUIREMENTS = ("litellm[proxy]==1.108.0",)  # newer releases pin litellm-proxy-extras builds not on PyPI
API_KEY = "sk-bench-" + secrets.token_hex(24)  # the gateway's and LiteLLM's client key this session
SIM_TTFT = 0.05  # seconds the simulator waits before the first token
TTFT_TPS = 1000  # pieces per second of the TTFT simulator: answers end soon after their first token
PROMPT = "question {:08d}"  # every prompt the same length, so every answer has the same number of pieces
CACHED_INDEX = 99_999_999  # the one prompt repeated for exact-cache hits
BARE, GATEWAY, CACHED, LITELLM = "bare simulator", "gateway", "gateway (exact-cache hits)", "LiteLLM proxy"
MODELS = {"ttft": "hunyuan-lite", "rps": "hunyuan-standard", "streams": "hunyuan-turbo"}  # one simulator each
TARGET_STREAMS = 1000
TTFT_P50_MS, TTFT_P99_MS, RPS_VS_LITELLM = 2.0, 10.0, 3.0
LITELLM_NOTE = (
    f"LiteLLM: {LITELLM_REQUIREMENTS[0]} in its own virtual environment, one uvicorn worker (uvloop), master key, "
    "no database, num_retries 0, model openai/<name> at the same simulator."
)
_prompts = itertools.count()


@dataclass(frozen=True)
class Plan:
    """How much load each measurement gets."""

    runs: int = 3
    ttft_concurrency: tuple[int, ...] = (1, 16)
    rps_concurrency: tuple[int, ...] = (1, 8, 32, 128)  # the ratio to LiteLLM is judged at 32
    ttft_seconds: float = 8.0  # length of one run; its request count comes from a warm-up run...
    ttft_min_requests: int = 100  # ...but at least this many, so that p99 is not just the maximum
    rps_seconds: float = 3.0
    streams: int = TARGET_STREAMS
    stream_seconds: float = 10.0
    litellm: bool = True


QUICK = Plan(1, (1, 4), (1, 8), 1.0, 20, rps_seconds=0.5, streams=50, stream_seconds=2.0, litellm=False)


@dataclass(frozen=True)
class Route:
    """One way to a simulator: straight, through the gateway, or through LiteLLM."""

    system: str
    base_url: str  # OpenAI base URL, ending in /v1
    model: str
    proxy: ServerProcess | None  # the process whose cost is measured; None: bare simulator
    upstream: ServerProcess
    repeat: bool = False  # the same request every time (exact-cache hits)
    headers: Mapping[str, str] = field(default_factory=lambda: {"Authorization": f"Bearer {API_KEY}"})

    def body(self, *, stream: bool) -> dict[str, Any]:
        index = CACHED_INDEX if self.repeat else next(_prompts)
        messages = [{"role": "user", "content": PROMPT.format(index)}]
        return {"model": self.model, "messages": messages, "stream": stream}

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far of (proxy, simulator); the proxy's is 0 for the bare simulator."""
        return (self.proxy.cpu_seconds() if self.proxy else 0.0), self.upstream.cpu_seconds()


@dataclass
class Sample:
    """One run of one route: its load statistics and the CPU its servers spent meanwhile."""

    stats: RunStats
    proxy_cpu: float = 0.0
    upstream_cpu: float = 0.0
    counts: dict[str, float] = field(default_factory=dict)
    failures: Counter[str] = field(default_factory=Counter)


class AnswerError(Exception):
    """An answer that is not a complete, error-free completion."""


class Probe:
    """Sends one kind of request through a route and records what a single latency cannot say."""

    def __init__(self, client: aiohttp.ClientSession, route: Route) -> None:
        self.client = client
        self.route = route
        self.url = f"{route.base_url}/chat/completions"
        self.headers = dict(route.headers)
        self.ttfts: list[float] = []  # seconds to the first content chunk, completed streams only
        self.open = self.peak_open = self.hits = 0
        self.failures: Counter[str] = Counter()

    async def complete(self, index: int) -> int:
        try:
            async with self.client.post(self.url, json=self.route.body(stream=False), headers=self.headers) as response:
                body = await response.read()
                if response.status != 200:
                    raise AnswerError(f"status {response.status}: {body[:200]!r}")
        except Exception as exc:
            self.failures[_reason(exc)] += 1
            raise
        self.hits += response.headers.get("x-cache") == "hit"
        return 1

    async def stream(self, index: int) -> int:
        body = self.route.body(stream=True)
        started = time.perf_counter()
        try:
            async with self.client.post(self.url, json=body, headers=self.headers) as response:
                if response.status != 200:
                    raise AnswerError(f"status {response.status}: {(await response.read())[:200]!r}")
                self.open += 1
                self.peak_open = max(self.peak_open, self.open)
                try:
                    ttft = await first_content_seconds(decoded_lines(response), started)
                finally:
                    self.open -= 1
        except Exception as exc:
            self.failures[_reason(exc)] += 1
            raise
        self.ttfts.append(ttft)
        return 1


async def decoded_lines(response: aiohttp.ClientResponse) -> AsyncIterator[str]:
    async for line in response.content:
        yield line.decode("utf-8")


async def first_content_seconds(lines: AsyncIterator[str], started: float) -> float:
    """Read an SSE stream to [DONE]; the time from `started` to the first chunk with content."""
    first: float | None = None
    async for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            if first is None:
                raise AnswerError("stream ended without content")
            return first
        chunk = json.loads(data)
        if "error" in chunk:
            raise AnswerError(f"error event: {str(chunk['error'])[:200]}")
        if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
            first = time.perf_counter() - started
    raise AnswerError("stream ended without [DONE]")


def _reason(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:160]


# -- pure helpers -------------------------------------------------------------------------------------


def stream_tps(seconds: float, ttft: float = SIM_TTFT) -> float:
    """Simulator pieces per second so that a streamed answer to PROMPT lasts `seconds`."""
    pieces = len(split_pieces(echo_reply([{"role": "user", "content": PROMPT.format(0)}])))
    return (pieces - 1) / max(seconds - ttft, 0.1)


def run_size(rate: float, seconds: float, concurrency: int, minimum: int = 0) -> int:
    """Requests for a run of about `seconds` at `rate` requests/s; at least `minimum` and 4 per slot."""
    return max(4 * concurrency, minimum, min(int(rate * seconds), 100_000))


def rotated(routes: Sequence[Route], shift: int) -> list[Route]:
    shift %= max(len(routes), 1)
    return [*routes[shift:], *routes[:shift]]


def added_ms(proxy: Sequence[RunStats], bare: Sequence[RunStats], q: float) -> float:
    """Median over rounds of (proxy's q-th percentile - bare's q-th percentile of the same round), in ms."""
    return median([p.p(q) - b.p(q) for p, b in zip(proxy, bare, strict=True)])


def ratio(value: float, reference: float) -> float:
    return value / reference if reference > 0 else float("nan")


def at_most(name: str, value: float, limit: float, context: str = "") -> Target:
    if value != value:  # NaN: the system did not run
        return Target(name, f"<= {limit:g} ms", "not measured", False)
    return Target(name, f"<= {limit:g} ms", f"{value:.2f} ms{context}", value <= limit)


def at_least_times(name: str, value: float, reference: float, factor: float, context: str = "") -> Target:
    goal = f">= {factor:g} x"
    if not (value > 0 and reference > 0):
        return Target(name, goal, "not measured", False)
    times = value / reference
    return Target(name, goal, f"{times:.2f} x ({value:.0f} vs {reference:.0f} requests/s{context})", times >= factor)


def streams_target(opened: int, held: Sequence[float], peak: Sequence[float], added_p50: float) -> Target:
    """Met when every run held all `TARGET_STREAMS` streams open at once and all of them completed."""
    name, goal = "Chat: concurrent streams held", f">= {TARGET_STREAMS:,} (all complete, all open at once)"
    if not held:
        return Target(name, goal, "not measured", False)
    measured = f"{min(held):.0f}/{opened} completed, {min(peak):.0f} open at once (worst run); added TTFT p50 "
    measured += f"{added_p50:.1f} ms"
    return Target(name, goal, measured, opened >= TARGET_STREAMS and min(held) >= opened and min(peak) >= opened)


def litellm_config(routes: Mapping[str, str], api_key: str = API_KEY) -> str:
    """LiteLLM's config.yaml (JSON is YAML) mapping each model name to `openai/<model>` at its simulator."""
    model_list = [
        {"model_name": model, "litellm_params": {"model": f"openai/{model}", "api_base": base, "api_key": api_key}}
        for model, base in routes.items()
    ]
    settings = {"drop_params": True, "num_retries": 0, "request_timeout": 120}
    return json.dumps({"model_list": model_list, "litellm_settings": settings}, indent=2) + "\n"


def gateway_env(simulator_url: str, *, cache: bool) -> dict[str, str]:
    """Chat only (Triton at a closed port); quota, pool and in-flight limits far above the load."""
    return {
        "TRITON_URL": "127.0.0.1:9",
        "GATEWAY_API_KEYS": API_KEY,
        "GATEWAY_MAX_IN_FLIGHT": "5000",
        "HUNYUAN_BASE_URL": simulator_url,
        "HUNYUAN_API_KEY": API_KEY,
        "HUNYUAN_REQUESTS_PER_SECOND": "100000",
        "HUNYUAN_MAX_CONCURRENT": "5000",
        "HUNYUAN_MAX_CONNECTIONS": "2000",
        "CHAT_CACHE_MB": "64" if cache else "0",
        "CHAT_SEMANTIC_MATCHER": "off",
    }


def simulator_args(ttft: float, tps: float) -> list[str]:
    return ["--qps", "0", "--ttft", f"{ttft:g}", "--tps", f"{tps:.4f}", "--log-level", "warning"]


def raise_open_files(needed: int) -> str | None:
    """Lift this process's soft limit on open files to `needed` (bounded by the hard limit) if it is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return None
    wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return f"client open-file limit raised from {soft} to {wanted}"


# -- the servers --------------------------------------------------------------------------------------


def litellm_endpoint(python: Path, config: Path, log_dir: Path) -> Endpoint:
    """LiteLLM's proxy on a free port: one worker, master key, no database, access log off."""
    port = free_port()
    command = [str(python.parent / "litellm"), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    env = {"LITELLM_MASTER_KEY": API_KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    server = ServerProcess("litellm", [*command, "--num_workers", "1"], env=env, log_dir=log_dir)
    base = f"http://127.0.0.1:{port}"
    return Endpoint(server, f"{base}/health/liveliness", f"{base}/v1")


async def start(make: Callable[[], Endpoint], started: list[ServerProcess], attempts: int = 3) -> Endpoint:
    """Make a server (on fresh free ports) and start it; again if it fails, since another process may take
    a port `free_port()` chose before the server binds it."""
    for attempt in range(attempts):
        endpoint = make()
        started.append(endpoint.server)
        try:
            await asyncio.to_thread(endpoint.server.start, endpoint.ready_url)
            return endpoint
        except RuntimeError:
            if attempt == attempts - 1:
                raise
    raise ValueError(f"attempts must be positive, got {attempts}")


async def start_all(makers: Mapping[str, Callable[[], Endpoint]], started: list[ServerProcess]) -> dict[str, Endpoint]:
    outcomes = await asyncio.gather(*(start(make, started) for make in makers.values()), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return {name: outcome for name, outcome in zip(makers, outcomes, strict=True) if isinstance(outcome, Endpoint)}


async def start_litellm(log_dir: Path, routes: Mapping[str, str], started: list[ServerProcess]) -> Endpoint:
    python = await asyncio.to_thread(venv_python, "litellm", LITELLM_REQUIREMENTS)
    log_dir.mkdir(parents=True, exist_ok=True)
    config = log_dir / "litellm-config.yaml"
    config.write_text(litellm_config(routes))
    return await start(partial(litellm_endpoint, python, config, log_dir), started)


@contextlib.asynccontextmanager
async def chat_stack(log_dir: Path, plan: Plan, notes: list[str]) -> AsyncIterator[dict[str, list[Route]]]:
    """Per measurement (see MODELS) a simulator, a gateway in front of it and LiteLLM in front of all three,
    plus a gateway with the exact cache on in front of the unpaced simulator. Yields each measurement's
    routes, the bare simulator first; stops everything on exit."""
    started: list[ServerProcess] = []
    peer: asyncio.Future[Endpoint] | None = None
    stream_args = simulator_args(SIM_TTFT, stream_tps(plan.stream_seconds))
    sim_args = {"ttft": simulator_args(SIM_TTFT, TTFT_TPS), "rps": simulator_args(0, 0), "streams": stream_args}
    try:
        makers = {phase: partial(hunyuan_simulator, log_dir / phase, *args) for phase, args in sim_args.items()}
        sims = await start_all(makers, started)
        if plan.litellm:
            peer_routes = {MODELS[phase]: sim.base_url for phase, sim in sims.items()}
            peer = asyncio.ensure_future(start_litellm(log_dir / "litellm", peer_routes, started))
        gateway_makers = {
            phase: partial(gateway, log_dir / phase, gateway_env(sim.base_url, cache=False))
            for phase, sim in sims.items()
        }
        cached_env = gateway_env(sims["rps"].base_url, cache=True)
        gateway_makers[CACHED] = partial(gateway, log_dir / "rps", cached_env, name="gateway-cached")
        gateways = await start_all(gateway_makers, started)
        litellm: Endpoint | None = None
        try:
            litellm = await peer if peer is not None else None
            notes.append(LITELLM_NOTE if litellm else "LiteLLM proxy not run (quick mode).")
        except Exception as exc:  # a peer that cannot run is reported, never fatal
            notes.append(f"LiteLLM proxy not run: {_reason(exc)}")
        yield {phase: routes_to(phase, sim, gateways, litellm) for phase, sim in sims.items()}
    finally:
        if peer is not None:
            await asyncio.gather(peer, return_exceptions=True)  # its server must be up before it can be stopped
        for server in started:
            server.stop()


def routes_to(phase: str, sim: Endpoint, gateways: Mapping[str, Endpoint], litellm: Endpoint | None) -> list[Route]:
    """The ways to one measurement's simulator, the bare one first."""
    model, gw, cached = MODELS[phase], gateways[phase], gateways[CACHED]
    found = [Route(BARE, sim.base_url, model, None, sim.server)]
    found.append(Route(GATEWAY, f"{gw.base_url}/v1", model, gw.server, sim.server))
    if phase == "rps":
        found.append(Route(CACHED, f"{cached.base_url}/v1", model, cached.server, sim.server, repeat=True))
    if litellm is not None:
        found.append(Route(LITELLM, litellm.base_url, model, litellm.server, sim.server))
    return found


# -- measurements -------------------------------------------------------------------------------------

Results = dict[int, dict[str, list[Sample]]]  # concurrency -> system -> one sample per round
RunFunction = Callable[[aiohttp.ClientSession, Route, int, int], Awaitable[Sample]]


async def measured(route: Route, load: Awaitable[RunStats], probe: Probe) -> Sample:
    """`load`'s statistics and the CPU the route's proxy and simulator spent while it ran."""
    proxy, upstream = route.cpu()
    stats = await load
    proxy_after, upstream_after = route.cpu()
    return Sample(stats, proxy_after - proxy, upstream_after - upstream, failures=probe.failures)


async def stream_run(client: aiohttp.ClientSession, route: Route, total: int, concurrency: int) -> Sample:
    """Streamed requests; the sample's latencies are times to first content, of completed streams only."""
    probe = Probe(client, route)
    sample = await measured(route, closed_loop(probe.stream, total=total, concurrency=concurrency), probe)
    sample.stats = replace(sample.stats, latencies=probe.ttfts)
    sample.counts = {"opened": total, "completed": len(probe.ttfts), "peak_open": probe.peak_open}
    return sample


async def completion_run(client: aiohttp.ClientSession, route: Route, total: int, concurrency: int) -> Sample:
    """Non-streamed requests; counts the answers the gateway marked `X-Cache: hit`."""
    probe = Probe(client, route)
    sample = await measured(route, closed_loop(probe.complete, total=total, concurrency=concurrency), probe)
    sample.counts = {"cache_hit_ratio": probe.hits / max(total, 1)}
    return sample


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


# -- results ------------------------------------------------------------------------------------------


def _median_of(samples: Sequence[Sample], value: Callable[[Sample], float]) -> float:
    return median([value(sample) for sample in samples if sample.stats.elapsed > 0])


def point(system: str, x: float, samples: Sequence[Sample], reference: Sequence[Sample]) -> Point:
    """Medians over rounds, with CPU, counts, latency added to and throughput relative to `reference`."""
    stats, reference_stats = [s.stats for s in samples], [s.stats for s in reference]
    result = summarize(system, x, stats, per="requests")
    result.extra |= {
        "proxy_cpu_percent": _median_of(samples, lambda s: 100 * s.proxy_cpu / s.stats.elapsed),
        "simulator_cpu_percent": _median_of(samples, lambda s: 100 * s.upstream_cpu / s.stats.elapsed),
        "proxy_cpu_ms_per_request": _median_of(samples, lambda s: 1000 * s.proxy_cpu / max(len(s.stats.latencies), 1)),
        "added_p50_ms": added_ms(stats, reference_stats, 50),
        "added_p99_ms": added_ms(stats, reference_stats, 99),
        "ratio_to_reference": ratio(result.throughput, median([r.requests_per_second for r in reference_stats])),
    }
    result.extra |= {key: median([s.counts[key] for s in samples]) for key in samples[0].counts}
    return result


def series(results: Results) -> list[Point]:
    return [
        point(system, x, samples, by_system[BARE])
        for x, by_system in results.items()
        for system, samples in by_system.items()
    ]


def find(points: Sequence[Point], system: str, x: float) -> Point | None:
    return next((p for p in points if p.system == system and p.x == x), None)


def rows(measurement: str, points: Sequence[Point], *, versus_litellm: bool = False) -> list[dict[str, Any]]:
    """Table rows; the proxy columns are empty for the bare simulator."""
    table = []
    for p in points:
        extra, litellm, proxy = p.extra, find(points, LITELLM, p.x) if versus_litellm else None, p.system != BARE
        row: dict[str, Any] = {"measurement": measurement, "system": p.system, "concurrency": int(p.x)}
        row |= {"requests/s": p.throughput, "p50 ms": p.p50_ms, "p99 ms": p.p99_ms}
        row |= {"added p50 ms": extra["added_p50_ms"], "added p99 ms": extra["added_p99_ms"]}
        row |= {
            "x bare": extra["ratio_to_reference"],
            "x LiteLLM": ratio(p.throughput, litellm.throughput) if litellm else None,
        }
        row |= {"proxy CPU %": extra["proxy_cpu_percent"] if proxy else None}
        row |= {"proxy CPU ms/req": extra["proxy_cpu_ms_per_request"] if proxy else None}
        row |= {"simulator CPU %": extra["simulator_cpu_percent"], "client CPU %": extra["client_cpu_percent"]}
        row |= {"errors": int(extra["errors"])}
        if "opened" in extra:
            row |= {
                "completed": f"{extra['completed']:.0f}/{extra['opened']:.0f}",
                "peak open": int(extra["peak_open"]),
            }
        table.append(row)
    return table


def ttft_targets(points: Sequence[Point]) -> list[Target]:
    targets = []
    for x in sorted({p.x for p in points}):
        gw, litellm = find(points, GATEWAY, x), find(points, LITELLM, x)
        for q, limit in ((50, TTFT_P50_MS), (99, TTFT_P99_MS)):
            key = f"added_p{q}_ms"
            context = f" (LiteLLM {litellm.extra[key]:.1f} ms)" if litellm else ""
            value = gw.extra[key] if gw else float("nan")
            targets.append(at_most(f"Chat: added TTFT p{q}, concurrency {x:.0f}", value, limit, context))
    return targets


def rps_target(points: Sequence[Point]) -> Target:
    """Gateway vs LiteLLM requests/s at concurrency 32 (or the highest below it); the context adds what each
    proxy serves per second of its own CPU, which other processes on a small machine do not skew."""
    concurrency = max((p.x for p in points if p.x <= 32), default=0)
    gw, litellm = find(points, GATEWAY, concurrency), find(points, LITELLM, concurrency)
    name = f"Chat: requests/s vs LiteLLM proxy (uncached, concurrency {concurrency:.0f})"
    context = ""
    if gw and litellm:
        per_cpu = [1000 / point.extra["proxy_cpu_ms_per_request"] for point in (gw, litellm)]
        context = f"; per proxy CPU-second {per_cpu[0]:.0f} vs {per_cpu[1]:.0f} = {ratio(*per_cpu):.1f} x"
    return at_least_times(
        name, gw.throughput if gw else 0.0, litellm.throughput if litellm else 0.0, RPS_VS_LITELLM, context
    )


def failure_notes(*groups: Mapping[str, Sequence[Sample]]) -> list[str]:
    counted: Counter[str] = Counter()
    for group in groups:
        for system, samples in group.items():
            for sample in samples:
                counted.update({f"{system}: {reason}": n for reason, n in sample.failures.items()})
    return [f"failed requests, {reason} (x{n})" for reason, n in counted.most_common(10)]


def assemble(plan: Plan, ttft: Results, rps: Results, streams: dict[str, list[Sample]], notes: list[str]) -> PartResult:
    ttft_points, rps_points, burst = series(ttft), series(rps), series({plan.streams: streams})
    gw_burst = find(burst, GATEWAY, plan.streams)
    held = [sample.counts["completed"] for sample in streams.get(GATEWAY, [])]
    peak = [sample.counts["peak_open"] for sample in streams.get(GATEWAY, [])]
    table = [*rows("TTFT", ttft_points), *rows("completions", rps_points, versus_litellm=True)]
    targets = [
        *ttft_targets(ttft_points),
        streams_target(plan.streams, held, peak, gw_burst.extra["added_p50_ms"] if gw_burst else float("nan")),
        rps_target(rps_points),
    ]
    notes += failure_notes(*ttft.values(), *rps.values(), streams)
    return PartResult(
        "chat", "concurrency", "requests/s", rps_points, table + rows("streams at once", burst), targets, notes
    )


def plan_notes(plan: Plan) -> list[str]:
    host = machine()
    return [
        f"{host['cores']} cores ({host['cpu']}) shared by the load generator, the simulators, the gateways and "
        "LiteLLM: requests/s are bounded by the CPU all of them spend per request. CPU % columns: 100 = one core; "
        "'proxy CPU ms/req' is the gateway's (or LiteLLM's) own CPU per request. Load average at the start: "
        f"{os.getloadavg()[0]:.1f} (other work on the machine skews absolute figures, not the alternation).",
        f"{plan.runs} round(s); each runs every system once, the order rotated per round; figures are medians "
        "over rounds. Added p50 (p99) = a system's p50 (p99) minus the bare simulator's of the same round; "
        "'x bare' = requests/s relative to the bare simulator.",
        f"TTFT rows: streamed requests, p50/p99 = time to the first content chunk; simulator TTFT "
        f"{SIM_TTFT * 1000:.0f} ms, {TTFT_TPS} pieces/s. Completions rows: non-streamed, whole-request latency, "
        "simulator unpaced (TTFT 0), every prompt unique except for the exact-cache-hit series.",
        f"Streams at once: {plan.streams} streams opened together per system and round, simulator TTFT "
        f"{SIM_TTFT * 1000:.0f} ms and {stream_tps(plan.stream_seconds):.2f} pieces/s, so each lasts about "
        f"{plan.stream_seconds:g} s; 'completed' = ended with [DONE] and no error event, 'peak open' = "
        "answers streaming at the same moment.",
        "Gateway: one process, API key checked, exact cache off (CHAT_CACHE_MB=0) except for the cache-hit "
        "series, semantic cache off, quota 100000 QPS / 5000 concurrent, HUNYUAN_MAX_CONNECTIONS=2000, "
        "GATEWAY_MAX_IN_FLIGHT=5000.",
    ]


async def run(out_dir: Path, *, runs: int = 3, quick: bool = False) -> PartResult:
    """Measure everything (quick: tiny loads, one round, 50 streams, no LiteLLM) and write chat.json."""
    plan = QUICK if quick else replace(Plan(), runs=max(runs, 1))
    notes = plan_notes(plan)
    if (note := raise_open_files(2 * plan.streams + 512)) is not None:
        notes.append(note)
    async with chat_stack(out_dir / "logs" / "chat", plan, notes) as routes:
        ttft_plan = (plan.ttft_concurrency, stream_run, plan.ttft_seconds, plan.ttft_min_requests)
        ttft = await sweep(routes["ttft"], plan.runs, *ttft_plan)
        rps = await sweep(routes["rps"], plan.runs, plan.rps_concurrency, completion_run, plan.rps_seconds)
        streams = await bursts(routes["streams"], plan)
    result = assemble(plan, ttft, rps, streams, notes)
    result.write(out_dir)
    return result
