"""The keys part's table (each gateway's latency and the added latency of the keys), the goal's targets and
the notes that explain the figures."""

from __future__ import annotations

import math
from collections.abc import Sequence

from bench.chat.report import added_ms
from bench.embeddings.loads import Series
from bench.keys.plan import COMPARISONS, GOAL_ADDED_P99_MS, PART, RATE, SECONDS, TEXTS, Config
from bench.results import PartResult, Target, load_note
from bench.run_stats import median


def cpu_ms_per_request(series: Series) -> list[float]:
    """Each round's gateway CPU per answered request, in ms: steadier than latency on a shared machine."""
    return [
        window.get("gateway_cpu_percent", math.nan) / 100 * run.elapsed / max(len(run.latencies), 1) * 1000
        for run, window in zip(series.runs, series.cpu, strict=True)
    ]


def added_cpu_ms(keyed: Series, base: Series) -> float:
    """Median over rounds of the keyed gateway's CPU per request minus its baseline's in the same round."""
    pairs = zip(cpu_ms_per_request(keyed), cpu_ms_per_request(base), strict=False)
    return median([k - b for k, b in pairs])


def build_result(
    series: Sequence[Series], configs: Sequence[Config], runs: int, quick: bool, load_at_start: float, notes: list[str]
) -> PartResult:
    by_config = dict(zip(configs, series, strict=True))
    points = [item.point() for item in series]
    rows: list[dict[str, object]] = [
        {
            "configuration": point.system,
            "offered /s": RATE,
            "achieved /s": point.throughput,
            "p50 ms": point.p50_ms,
            "p99 ms": point.p99_ms,
            "gateway CPU %": point.extra.get("gateway_cpu_percent"),
            "gateway CPU ms/request": median(cpu_ms_per_request(item)),
            "other CPU %": point.extra.get("foreign_cpu_percent"),
            "errors (all runs)": point.extra.get("errors"),
            "cache misses (median run)": point.extra.get("cache_misses"),
        }
        for point, item in zip(points, series, strict=True)
    ]
    targets = []
    for keyed, base, judged in COMPARISONS:
        if keyed not in by_config or base not in by_config or not by_config[keyed].runs:
            continue
        p50, p99 = (added_ms(by_config[keyed].runs, by_config[base].runs, q) for q in (50, 99))
        label = f"{keyed.name} vs {base.name}"
        cpu = added_cpu_ms(by_config[keyed], by_config[base])
        rows.append(
            {
                "configuration": f"added: {label}",
                "added p50 ms": f"{p50:.3f}",
                "added p99 ms": f"{p99:.3f}",
                "added gateway CPU ms/request": f"{cpu:.3f}",
            }
        )
        if judged:
            pair = (by_config[keyed], by_config[base])
            errors = sum(run.errors for item in pair for run in item.runs)
            misses = sum(counters.get("cache_misses", 0.0) for item in pair for counters in item.counters)
            # A miss means Triton answered: that run measured more than the keys, so it cannot meet the goal.
            spoiled = "".join(f"; {n:g} {what}" for n, what in ((errors, "errors"), (misses, "cache misses")) if n)
            targets.append(
                Target(
                    name=f"added p99, cached embeddings at {RATE:g} requests/s: {label}",
                    goal=f"<= {GOAL_ADDED_P99_MS:g} ms",
                    measured=f"{p99:.3f} ms (added p50 {p50:.3f} ms, gateway CPU {cpu:.3f} ms/request; median of "
                    f"{len(by_config[keyed].runs)} paired rounds{spoiled})",
                    met=p99 <= GOAL_ADDED_P99_MS and not spoiled,
                )
            )
    return PartResult(
        part=PART,
        x_label="requests/s offered",
        throughput_unit="requests/s",
        points=points,
        table=rows,
        targets=targets,
        notes=[*method_notes(runs, quick), load_note(load_at_start), *notes],
    )


def method_notes(runs: int, quick: bool) -> list[str]:
    return [
        f"Open loop at {RATE:g} requests/s for {SECONDS[quick]:g} s per gateway and round, one text per request "
        f"({TEXTS} texts cycled, every one in the warm embedding cache: Triton does no work); latency counts "
        "from the scheduled send; 32 unmeasured requests warm each load.",
        "Keyed gateways: one key from a keys file; the key and its team have requests-per-minute and monthly "
        "budget limits that never refuse, the model has a price: each request is authenticated (SHA-256 and a "
        "dict lookup), checked (key and team, rate and budget: with Redis from leased rate tokens and a copy of the "
        "spend, both renewed in the background, in memory without), "
        "priced and recorded. The open gateways record usage too (anonymous), so the added latency is the "
        "key lookup, the limits and the budget; the usage write is in both.",
        "With Redis the embedding cache is in Redis as well: keys are judged against the open gateway with the "
        "same stores; the plain difference to the in-process open gateway is listed too, without a goal.",
        f"Added p50 (p99): a keyed gateway's p50 (p99) minus its baseline's in the same round (a difference of "
        f"percentiles), median over {runs} rounds; each round runs every gateway once, in the reverse order of "
        "the round before. Gateway CPU %: during the load window, 100 = one core; other CPU %: the rest of the "
        "machine meanwhile; gateway CPU ms/request (and its added figure, paired the same way) is steadier than "
        "latency where other work shares the cores.",
        *(["Quick mode: short loads; the numbers check the harness, not the stack."] if quick else []),
    ]
