"""The chat part's result: medians over rounds per system and concurrency (added latency and ratios against the
bare simulator), the table, the targets and the notes."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench.chat.loads import Results, Sample
from bench.chat.plan import (
    BARE,
    GATEWAY,
    LITELLM,
    PART,
    RPS_VS_LITELLM,
    SIM_TTFT,
    TARGET_STREAMS,
    TTFT_P50_MS,
    TTFT_P99_MS,
    TTFT_TPS,
    Plan,
    stream_tps,
)
from bench.results import PartResult, Point, Target, machine, summarize
from bench.run_stats import RunStats, median


def added_ms(proxy: Sequence[RunStats], bare: Sequence[RunStats], q: float) -> float:
    """Median over rounds of (proxy's q-th percentile - bare's q-th percentile of the same round), in ms."""
    return median([p.p(q) - b.p(q) for p, b in zip(proxy, bare, strict=True)])


def ratio(value: float, reference: float) -> float:
    return value / reference if reference > 0 else float("nan")


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
    if all(s.first_byte for s in [*samples, *reference]):  # streams: the first byte too, beside the first answer
        first, reference_first = [s.first_byte_stats() for s in samples], [s.first_byte_stats() for s in reference]
        result.extra |= {
            "ttfb_p50_ms": median([run.p(50) for run in first]),
            "ttfb_p99_ms": median([run.p(99) for run in first]),
            "added_ttfb_p50_ms": added_ms(first, reference_first, 50),
            "added_ttfb_p99_ms": added_ms(first, reference_first, 99),
        }
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
        if "ttfb_p50_ms" in extra:
            row |= {"TTFB p50 ms": extra["ttfb_p50_ms"], "TTFB p99 ms": extra["ttfb_p99_ms"]}
            row |= {"added TTFB p50 ms": extra["added_ttfb_p50_ms"], "added TTFB p99 ms": extra["added_ttfb_p99_ms"]}
        if "opened" in extra:
            row |= {
                "completed": f"{extra['completed']:.0f}/{extra['opened']:.0f}",
                "peak open": int(extra["peak_open"]),
            }
        table.append(row)
    return table


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


def plan_notes(plan: Plan) -> list[str]:
    host = machine()
    return [
        f"{host['cores']} cores ({host['cpu']}) shared by the load generator, the simulators, the gateways and "
        "LiteLLM: requests/s are bounded by the CPU all of them spend per request. CPU % columns: 100 = one core; "
        "'proxy CPU ms/req' is the gateway's (or LiteLLM's) own CPU per request. Load average at the start: "
        f"{os.getloadavg()[0]:.1f} (other work on the machine skews absolute figures, not the alternation).",
        f"{plan.runs} round(s); each runs every system once, the order rotated per round; figures are medians "
        "over rounds. Added p50 (p99) = a system's p50 (p99) minus the bare simulator's of the same round; "
        "'x bare' = requests/s relative to the bare simulator. Streams at concurrency 1: in each round the "
        "systems take turns request by request (the order rotated per request), so that they share every "
        "moment of the machine; their requests/s are per second spent in their own requests.",
        f"TTFT rows: streamed requests of a reasoning model (it thinks by default: reasoning_content pieces, "
        "then the answer), p50/p99 = time to the first answer token (content chunk); TTFB = time to the first "
        f"event (the role chunk, before the reasoning); simulator TTFT {SIM_TTFT * 1000:.0f} ms, {TTFT_TPS} "
        "pieces/s. Completions rows: non-streamed, whole-request latency, simulator unpaced (TTFT 0), every "
        "prompt unique except for the exact-cache-hit series.",
        f"Streams at once: {plan.streams} streams opened together per system and round, simulator TTFT "
        f"{SIM_TTFT * 1000:.0f} ms and {stream_tps(plan.stream_seconds):.2f} pieces/s, so each lasts about "
        f"{plan.stream_seconds:g} s; 'completed' = ended with [DONE] and no error event, 'peak open' = "
        "answers streaming at the same moment.",
        "Gateway: one process, API key checked, exact cache off (CHAT_CACHE_MB=0) except for the cache-hit "
        "series, semantic cache off, quota 100000 QPS / 5000 concurrent, CHAT_MAX_CONNECTIONS=2000, "
        "GATEWAY_MAX_IN_FLIGHT=5000.",
    ]


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
        PART, "concurrency", "requests/s", rps_points, table + rows("streams at once", burst), targets, notes
    )
