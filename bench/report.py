"""Turn the parts of one benchmark run into `report.md`, `results.json` and PNG plots.

Each part wrote `<part>.json` (a `PartResult`) into the run's directory. For every part with swept
points, two plots: throughput and p99 latency against the swept variable, one line per system.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

PARTS = ("embeddings", "chat", "video", "caches", "keys", "search", "gpu")


def load_parts(run_dir: Path) -> list[dict[str, Any]]:
    order = {name: index for index, name in enumerate(PARTS)}
    parts = [json.loads(path.read_text()) for path in run_dir.glob("*.json") if path.stem in order]
    return sorted(parts, key=lambda part: order[part["part"]])


def plot(part: dict[str, Any], run_dir: Path) -> list[Path]:
    """`<part>-throughput.png` and `<part>-p99.png`; nothing when the part has no swept points."""
    points = part["points"]
    if not points:
        return []
    systems = sorted({point["system"] for point in points}, key=[point["system"] for point in points].index)
    written = []
    for field, label, suffix in (
        ("throughput", part["throughput_unit"], "throughput"),
        ("p99_ms", "p99 latency (ms)", "p99"),
    ):
        figure, axes = plt.subplots(figsize=(7, 4.5))
        for system in systems:
            series = sorted((p["x"], p[field]) for p in points if p["system"] == system and _finite(p[field]))
            if series:
                axes.plot(*zip(*series, strict=True), marker="o", label=system)
        axes.set_xlabel(part["x_label"])
        axes.set_ylabel(label)
        axes.set_title(f"{part['part']}: {label}")
        if len({p["x"] for p in points}) > 2:
            axes.set_xscale("log", base=2)
        if suffix == "p99":
            axes.set_yscale("log")
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=8)
        path = run_dir / f"{part['part']}-{suffix}.png"
        figure.tight_layout()
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written


def markdown(machine: dict[str, Any], parts: list[dict[str, Any]]) -> str:
    lines = [
        "# Benchmark report",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, "
        f"Python {machine['python']} ({machine['platform']}). Absolute numbers hold for this machine only.",
        "",
        "## Targets",
        "",
        "| part | target | goal | measured | |",
        "|---|---|---|---|---|",
    ]
    for part in parts:
        for target in part["targets"]:
            verdict = "met" if target["met"] else "**not met**"
            lines.append(f"| {part['part']} | {target['name']} | {target['goal']} | {target['measured']} | {verdict} |")
    for part in parts:
        lines += ["", f"## {part['part']}", ""]
        lines += table(part["table"])
        for suffix in ("throughput", "p99"):
            if part["points"]:
                lines += ["", f"![{part['part']} {suffix}]({part['part']}-{suffix}.png)"]
        if part["notes"]:
            lines += [""] + [f"- {note}" for note in part["notes"]]
    return "\n".join(lines) + "\n"


def table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return ["(no rows)"]
    columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(column)) for column in columns) + " |" for row in rows]
    return lines


def write_report(run_dir: Path, machine: dict[str, Any]) -> Path:
    parts = load_parts(run_dir)
    for part in parts:
        plot(part, run_dir)
    (run_dir / "results.json").write_text(json.dumps({"machine": machine, "parts": parts}, indent=2) + "\n")
    path = run_dir / "report.md"
    path.write_text(markdown(machine, parts))
    return path


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return "–"
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return str(value)
