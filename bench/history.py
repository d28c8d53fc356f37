"""`python -m bench history [--results DIR] [--part NAME] [--last N] [--json]`: the figures of every run, part by part.

The runs `make bench` wrote under bench/results/ (git-ignored) are the history of the benchmarks; docs/benchmarks.md
keeps only the latest figures. Each part gets a table with one line per run, oldest first: when it ran, on what
machine, whether the part finished, how many of its targets it met and each target's measured value (`!` marks a
missed one). A part without targets shows each system's highest throughput instead; the soak (its SLOs are its
targets, too many for a column each) names the ones it missed. Folders from older versions are read as far as they
go: a missing field shows as `?`, a file that cannot be read marks its part or its run, and a folder with nothing
readable is listed as skipped.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.paths import RESULTS
from bench.report import PARTS

RUN_NAME = "%Y%m%dT%H%M%SZ"  # the folder `python -m bench` names after its start time (UTC)
SOAK = Path("soak") / "soak.json"  # `python -m bench soak` writes into the same folders; its SLOs are its targets
MAX_COLUMNS = 10  # beyond this many targets (the soak's 27 SLOs), a run's line names the ones it missed instead
UNKNOWN = "?"


@dataclass
class Run:
    """One results folder: the parts it holds (as saved) and the files in it that could not be read."""

    name: str
    time: datetime
    machine: dict[str, Any] | None
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)  # file name -> why


@dataclass
class Column:
    """A figure column of a part's table: a target (keyed by name and goal), or a system's peak throughput."""

    label: str
    key: tuple[str, str]
    kind: str = "target"  # "target": its measured value; "peak": a system's highest throughput; "missed"


def load_runs(results: Path) -> tuple[list[Run], list[str]]:
    """Every run under `results` in time order, and a line for each folder skipped (nothing in it readable)."""
    runs, skipped = [], []
    for folder in sorted(path for path in results.iterdir() if path.is_dir()):
        run = read_run(folder)
        if run is None:
            continue  # not a bench run: the soak's or eval-cache's folder
        if run.parts:
            runs.append(run)
        else:
            skipped.append(f"{folder.name}: " + "; ".join(f"{name}: {why}" for name, why in run.unreadable.items()))
    return sorted(runs, key=lambda run: (run.time, run.name)), skipped


def read_run(folder: Path) -> Run | None:
    """The folder's parts: `results.json`'s, replaced by each `<part>.json` (what the part itself wrote), and
    the soak's, where it ran into this folder; None for a folder that holds none of them."""
    run = Run(folder.name, run_time(folder), machine=None)
    combined = read_json(run, folder / "results.json")
    if isinstance(combined, dict):
        run.machine = combined.get("machine") if isinstance(combined.get("machine"), dict) else None
        for part in combined.get("parts") or []:
            if isinstance(part, dict) and isinstance(part.get("part"), str):
                run.parts[part["part"]] = part
    for path in sorted(folder.glob("*.json")):
        if path.name == "results.json":
            continue
        named: Any = path.stem
        if path.stem in PARTS:
            part = read_json(run, path)
        else:  # a part an older version named otherwise names itself in its file; other JSON is no part
            part = quietly(path)
            named = part.get("part") if isinstance(part, dict) else None
        if isinstance(part, dict) and named == path.stem:
            run.parts[path.stem] = part
    soak = read_json(run, folder / SOAK)
    if isinstance(soak, dict) and isinstance(soak.get("slos"), list):
        judged = [slo for slo in soak["slos"] if isinstance(slo, dict) and slo.get("kind") != "capacity"]
        run.parts["soak"] = {"part": "soak", "targets": judged, "notes": []}
    return run if run.parts or run.unreadable else None


def read_json(run: Run, path: Path) -> Any:
    """The file's JSON, or None: a file that is there but unreadable is recorded in `run.unreadable`."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        run.unreadable[path.name] = f"{type(exc).__name__}: {exc}"
        return None


def quietly(path: Path) -> Any:
    """The file's JSON, or None if it has none: for files that need not be the bench's."""
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def run_time(folder: Path) -> datetime:
    """The start time in the folder's name; for a folder named by hand (`--out`), when it was last written."""
    return named_time(folder.name) or datetime.fromtimestamp(folder.stat().st_mtime, UTC)


def named_time(name: str) -> datetime | None:
    try:
        return datetime.strptime(name, RUN_NAME).replace(tzinfo=UTC)
    except ValueError:
        return None


def describe_machine(record: dict[str, Any] | None) -> str:
    if not record:
        return UNKNOWN
    cpu = re.sub(r"\((R|TM)\)|\bCPU\b|@.*$", "", str(record.get("cpu", UNKNOWN)))
    cpu = " ".join(cpu.split()) or UNKNOWN
    return f"{cpu}, {record.get('cores', UNKNOWN)} cores, {record.get('memory_gib', UNKNOWN)} GiB"


def status(part: dict[str, Any]) -> str:
    """`failed` or `partial` as `python -m bench` and the parts note it, else `ok`."""
    notes = [note for note in part.get("notes") or [] if isinstance(note, str)]
    for word in ("failed", "partial"):
        if any(note.startswith(f"{word}:") for note in notes):
            return word
    return "ok"


def targets(part: dict[str, Any]) -> list[dict[str, Any]]:
    """The part's targets that name themselves; `met` stays None where an older version did not record it."""
    found = part.get("targets")
    listed = found if isinstance(found, list) else []
    return [
        {
            "name": target["name"],
            "goal": str(target.get("goal", UNKNOWN)),
            "measured": str(target.get("measured", UNKNOWN)),
            "met": target["met"] if isinstance(target.get("met"), bool) else None,
        }
        for target in listed
        if isinstance(target, dict) and isinstance(target.get("name"), str)
    ]


def peaks(part: dict[str, Any]) -> dict[str, float]:
    """Each system's highest throughput over its swept points."""
    best: dict[str, float] = {}
    for point in part.get("points") or []:
        if isinstance(point, dict) and isinstance(point.get("throughput"), int | float):
            system = str(point.get("system", UNKNOWN))
            best[system] = max(best.get(system, float("-inf")), float(point["throughput"]))
    return best


def headline(measured: str) -> str:
    """The measured value without its detail: `0.68 x (spread ...)` -> `0.68 x`."""
    return re.split(r" \(|; ", measured, maxsplit=1)[0]


def columns(parts: list[dict[str, Any]]) -> list[Column]:
    """Targets in the order they first appear over the runs (a goal changed makes a new column), or the targets
    missed where there are too many to show; without targets, each system's peak throughput."""
    keys = dict.fromkeys((t["name"], t["goal"]) for part in parts for t in targets(part))
    if len(keys) > MAX_COLUMNS:
        return [Column("not met", ("", ""), kind="missed")]
    if keys:
        return [Column(f"T{index}", key) for index, key in enumerate(keys, 1)]
    unit = next((str(part.get("throughput_unit") or "") for part in parts), "")
    systems = dict.fromkeys(system for part in parts for system in peaks(part))
    return [Column(f"{system}, peak {unit}".strip(), (system, ""), kind="peak") for system in systems]


def cells(part: dict[str, Any], figures: list[Column]) -> list[str]:
    """`met`, then a cell per column."""
    found = {(t["name"], t["goal"]): t for t in targets(part)}
    met = f"{sum(t['met'] is True for t in found.values())}/{len(found)}" if found else "-"
    return [met, *(cell(column, found, part) for column in figures)]


def cell(column: Column, found: dict[tuple[str, str], dict[str, Any]], part: dict[str, Any]) -> str:
    """A target's headline (`!` when missed, `?` when not recorded), the targets missed, or a system's peak."""
    if column.kind == "missed":
        missed = [t for t in found.values() if t["met"] is not True]
        return ", ".join(t["name"] + ("" if t["met"] is False else f" {UNKNOWN}") for t in missed)
    if column.kind == "peak":
        best = peaks(part)
        return f"{best[column.key[0]]:.1f}" if column.key[0] in best else ""
    target = found.get(column.key)
    if target is None:
        return ""
    return headline(target["measured"]) + {True: "", False: " !", None: f" {UNKNOWN}"}[target["met"]]


def part_table(name: str, runs: list[Run]) -> list[str]:
    """The part's lines: a header, one row per run, then what each target column is."""
    parts = [run.parts[name] for run in runs]
    figures = columns(parts)
    rows = [["run (UTC)", "machine", "status", "met", *(column.label for column in figures)]]
    for run, part in zip(runs, parts, strict=True):
        when = run.time.strftime("%Y-%m-%d %H:%M")
        when += "" if named_time(run.name) else f" ({run.name})"
        rows.append([when, describe_machine(run.machine), status(part), *cells(part, figures)])
    widths = [max(len(row[index]) for row in rows) for index in range(len(rows[0]))]
    lines = [f"== {name} ==", *("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)]
    legend = [f"  {c.label}: {c.key[0]} (goal {c.key[1]})" for c in figures if c.kind == "target"]
    return lines + legend + (["  ! = not met, ? = not recorded"] if legend else [])


def part_names(runs: list[Run]) -> list[str]:
    """The bench's parts in its own order, then any an older version ran."""
    found = {name for run in runs for name in run.parts}
    return [name for name in PARTS if name in found] + sorted(found - set(PARTS))


def render(runs: list[Run], skipped: list[str], *, part: str | None, last: int | None) -> str:
    blocks = []
    for name in [part] if part else part_names(runs):
        having = [run for run in runs if name in run.parts][-last if last else None :]
        blocks.append(part_table(name, having) if having else [f"== {name} ==", "(no runs)"])
    problems = [f"  {run.name}: {file}: {why}" for run in runs for file, why in run.unreadable.items()]
    if problems:
        blocks.append(["unreadable files (their runs are shown without them):", *problems])
    if skipped:
        blocks.append(["skipped (nothing readable):", *(f"  {line}" for line in skipped)])
    return "\n\n".join("\n".join(block) for block in blocks) + "\n"


def as_json(runs: list[Run], skipped: list[str], *, part: str | None) -> str:
    records = [
        {
            "run": run.name,
            "time": run.time.isoformat(),
            "machine": run.machine,
            "parts": {
                name: {"status": status(saved), "targets": targets(saved), "peaks": peaks(saved)}
                for name, saved in run.parts.items()
                if part in (None, name)
            },
            "unreadable": run.unreadable,
        }
        for run in runs
        if part in (None, *run.parts)
    ]
    return json.dumps({"runs": records, "skipped": skipped}, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench history", description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, help="folder of runs (default bench/results)")
    parser.add_argument("--part", help=f"one part, e.g. {', '.join(PARTS)} (default: every part found)")
    parser.add_argument("--last", type=int, help="only the last N runs of each part (tables)")
    parser.add_argument("--json", action="store_true", help="every run's figures as JSON instead of tables")
    args = parser.parse_args(argv)
    if args.last is not None and args.last < 1:
        parser.error(f"--last takes a count of runs >= 1, got {args.last}")
    results = args.results or RESULTS
    if not results.is_dir():  # a fresh checkout has no runs yet; a folder named that is not there is a mistake
        print(f"no results folder at {results}: `make bench` writes one", file=sys.stderr)
        return 0 if args.results is None else 1
    runs, skipped = load_runs(results)
    if args.json:
        sys.stdout.write(as_json(runs, skipped, part=args.part))
    elif runs or skipped:
        sys.stdout.write(render(runs, skipped, part=args.part, last=args.last))
    else:
        print(f"no benchmark runs under {results}")
    return 0
