"""The soak's report: `soak.json` ({"slos": [{"name", "goal", "measured", "met"}], "phases": [...]}), `report.md`
and one PNG per figure (latency per route over time, error rate, RSS per process, Redis memory), every fault
shaded over its span so that its effect reads at a glance."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from bench.soak.records import Evidence, FaultEvent, Record, Slo
from bench.soak.rules import percentile

BUCKET_SECONDS = 10.0
ROUTE_GROUPS = {
    "embeddings": ("embeddings", "embeddings_batch"),
    "search": ("search", "search_filter", "search_after_upsert"),
    "chat": ("chat", "chat_stream"),
    "video submit": ("video_submit",),
    "writes": ("upsert", "delete"),
}


def write_report(
    out: Path, evidence: Evidence, slos: list[Slo], phases: list[dict[str, Any]], extra: dict[str, Any]
) -> Path:
    origin = min((r.start for r in evidence.records), default=evidence.warmup_end)
    figures = [
        plot_latency(out, evidence.records, evidence.faults, origin, evidence.warmup_end),
        plot_errors(out, evidence.records, evidence.faults, origin, evidence.warmup_end),
        plot_rss(out, evidence, origin),
        plot_redis_memory(out, evidence, origin),
    ]
    document = {
        "slos": [{"name": s.name, "goal": s.goal, "measured": s.measured, "met": s.met, "kind": s.kind} for s in slos],
        "phases": phases,
        "faults": [
            {"name": f.name, "component": f.component, "start": f.start, "end": f.end, "target": f.target, **f.detail}
            for f in evidence.faults
        ],
        "capacity": evidence.capacity,
        "requests": len(evidence.records),
        "figures": [figure.name for figure in figures if figure is not None],
        **extra,
    }
    (out / "soak.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    path = out / "report.md"
    path.write_text(markdown(document, origin))
    return path


def markdown(document: dict[str, Any], origin: float) -> str:
    judged = [s for s in document["slos"] if s["kind"] != "capacity"]
    met = sum(1 for s in judged if s["met"])
    lines = [
        "# Soak",
        "",
        f"{document['requests']} requests; {met} of {len(judged)} SLOs met (capacity is reported, not judged).",
        "",
        "| SLO | goal | measured | met |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {s['name']} | {s['goal']} | {s['measured']} | {'yes' if s['met'] else '**no**'} |" for s in document["slos"]
    ]
    lines += [
        "",
        "## Phases",
        "",
        "| phase | from (s) | to (s) | requests | failed | violations | cut in flight | p99 by route (ms) "
        "| load lag p99 (ms) |",
    ]
    lines += ["|---|---|---|---|---|---|---|---|---|"]
    for phase in document["phases"]:
        p99 = ", ".join(f"{route} {value:.0f}" for route, value in phase["p99_ms"].items() if not math.isnan(value))
        lines.append(
            f"| {phase['name']} | {phase['start'] - origin:.0f} | {phase['end'] - origin:.0f} | {phase['requests']} "
            f"| {phase['failed']} | {phase['violations']} | {phase['cut_in_flight']} | {p99} "
            f"| {phase['load_lag_p99_ms']} |"
        )
    lines += ["", "## Faults", ""]
    for fault in document["faults"]:
        error = f" (could not be applied: {fault['error']})" if "error" in fault else ""
        span = f"{fault['start'] - origin:.0f}-{fault['end'] - origin:.0f} s"
        lines.append(f"- {span}: {fault['name']} {fault.get('target', '')}{error}")
    if document.get("capacity"):
        lines += [
            "",
            "## Capacity (step load)",
            "",
            "| rate (/s) | requests | failed | p99 ms by route | busiest processes (cores) |",
            "|---|---|---|---|---|",
        ]
        for step in document["capacity"]["steps"]:
            busiest = sorted(step["cores"].items(), key=lambda item: -item[1])[:3]
            lines.append(
                f"| {step['rate']:.1f} | {step['requests']} | {step['failed']} | {step['p99_ms']} | "
                f"{', '.join(f'{name} {value:.2f}' for name, value in busiest)} |"
            )
    lines += ["", *[f"![{name}]({name})" for name in document["figures"]], ""]
    return "\n".join(lines)


def _faults(axes: Axes, faults: list[FaultEvent], origin: float, steady_from: float | None = None) -> None:
    if steady_from is not None and steady_from > origin:
        axes.axvspan(0, steady_from - origin, color="grey", alpha=0.12, label="step load and warm-up (not judged)")
    for index, fault in enumerate(faults):
        start, end = fault.start - origin, (fault.end or fault.start) - origin
        axes.axvspan(start, max(end, start + 1), color="tab:red", alpha=0.12)
        axes.axvline(start, color="tab:red", linewidth=0.8)
        axes.text(
            start,
            1.0,
            f" {fault.name}",
            transform=axes.get_xaxis_transform(),
            rotation=90,
            va="top",
            fontsize=7,
            color="tab:red",
        )
        del index


def _buckets(records: list[Record], origin: float) -> dict[int, list[Record]]:
    buckets: dict[int, list[Record]] = defaultdict(list)
    for record in records:
        buckets[int((record.end - origin) // BUCKET_SECONDS)].append(record)  # by its end, as the rules place it
    return buckets


def _save(figure: Any, axes: Axes, path: Path, title: str, ylabel: str) -> Path:
    axes.set_title(title)
    axes.set_xlabel("seconds since the first request (requests placed by when they ended)")
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the plot: fault labels stay clear
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_latency(out: Path, records: list[Record], faults: list[FaultEvent], origin: float, steady_from: float) -> Path:
    figure, axes = plt.subplots(figsize=(11, 5))
    for group, routes in ROUTE_GROUPS.items():
        ok = [r for r in records if r.route in routes and 200 <= r.status < 300 and not r.error]
        buckets = _buckets(ok, origin)
        xs = sorted(buckets)
        axes.plot(
            [BUCKET_SECONDS * (x + 0.5) for x in xs],
            [1000 * percentile([r.latency for r in buckets[x]], 99) for x in xs],
            label=f"{group} p99",
            marker=".",
        )
    axes.set_yscale("log")
    _faults(axes, faults, origin, steady_from)
    return _save(
        figure, axes, out / "latency.png", f"Latency p99 per route ({BUCKET_SECONDS:.0f} s buckets)", "ms (log)"
    )


def plot_errors(out: Path, records: list[Record], faults: list[FaultEvent], origin: float, steady_from: float) -> Path:
    figure, axes = plt.subplots(figsize=(11, 5))
    for group, routes in ROUTE_GROUPS.items():
        buckets = _buckets([r for r in records if r.route in routes], origin)
        xs = sorted(buckets)
        rates = [100 * sum(r.failed for r in buckets[x]) / len(buckets[x]) for x in xs]
        axes.plot([BUCKET_SECONDS * (x + 0.5) for x in xs], rates, label=group, marker=".")
    _faults(axes, faults, origin, steady_from)
    return _save(figure, axes, out / "errors.png", "Failed requests (5xx or no answer) per route", "% of requests")


def plot_rss(out: Path, evidence: Evidence, origin: float) -> Path:
    figure, axes = plt.subplots(figsize=(11, 5))
    series: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for sample in evidence.samples:
        series[sample.name].append((sample.time - origin, sample.rss))
    for name, points in sorted(series.items()):
        axes.plot([t for t, _ in points], [rss / 2**20 for _, rss in points], label=name, linewidth=1)
    _faults(axes, evidence.faults, origin)
    return _save(figure, axes, out / "rss.png", "Resident memory per process", "MiB")


def plot_redis_memory(out: Path, evidence: Evidence, origin: float) -> Path | None:
    memory = evidence.redis_memory
    if not memory:
        return None
    figure, axes = plt.subplots(figsize=(11, 4))
    axes.plot([m.time - origin for m in memory], [m.used / 2**20 for m in memory], label="used_memory")
    axes.axhline(memory[0].maxmemory / 2**20, color="black", linestyle="--", label="maxmemory")
    _faults(axes, evidence.faults, origin)
    return _save(figure, axes, out / "redis-memory.png", "Redis memory", "MiB")
