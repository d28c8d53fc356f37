"""The check's clock and its record.

A lent machine's time is counted for the whole call, so every step runs within what is left of one budget, and
the results file is rewritten after each step: a run cut short by the outer `timeout` keeps what it measured. A
step that cannot run (no GPU, a wheel not carried, too little time left) records why, and the next one runs.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS_FILE = "gpu_check.json"


class StepSkipped(Exception):
    """What a step needs is missing here; the message says what, and how to provide it."""


class Clock:
    """Seconds since the start, and how many of the budget are left; prints progress lines with the time."""

    def __init__(self, budget_seconds: float) -> None:
        self.budget_seconds = budget_seconds
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.budget_seconds - self.elapsed()

    def say(self, message: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {message}", flush=True)


class Record:
    """The results file: machine facts, then one entry per step (`ok`, `skipped` or `failed`, with why)."""

    def __init__(self, out_dir: Path, header: dict[str, Any]) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir = out_dir
        self.path = out_dir / RESULTS_FILE
        self.data: dict[str, Any] = {**header, "steps": {}}
        self.write()

    def step(self, name: str, entry: dict[str, Any]) -> None:
        self.data["steps"][name] = entry
        self.write()

    def write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.data, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)


def run_step(
    name: str, clock: Clock, record: Record, needs_seconds: float, body: Callable[[], dict[str, Any]]
) -> dict[str, Any] | None:
    """Run `body` if about `needs_seconds` are left; record its result, or why it did not run or failed.

    Returns the result, or None where the step did not complete: later steps that need it then skip."""
    began = clock.elapsed()
    if clock.left() < needs_seconds:
        reason = f"{clock.left():.0f} s of the budget left, needs ~{needs_seconds:.0f} s"
        _finish(name, clock, record, began, "skipped", reason)
        return None
    clock.say(f"{name}: start ({clock.left():.0f} s left)")
    try:
        result = body()
    except StepSkipped as exc:
        _finish(name, clock, record, began, "skipped", str(exc))
        return None
    except Exception as exc:  # a failed step must not stop the others: its error is the finding
        lines = traceback.format_exc().strip().splitlines()[-12:]
        _finish(name, clock, record, began, "failed", f"{type(exc).__name__}: {exc}", {"traceback": lines})
        return None
    record.step(name, {"status": "ok", "seconds": round(clock.elapsed() - began, 1), **result})
    clock.say(f"{name}: ok in {clock.elapsed() - began:.1f} s")
    return result


def _finish(
    name: str,
    clock: Clock,
    record: Record,
    began: float,
    status: str,
    reason: str,
    extra: dict[str, Any] | None = None,
) -> None:
    record.step(
        name, {"status": status, "reason": reason, "seconds": round(clock.elapsed() - began, 1), **(extra or {})}
    )
    clock.say(f"{name}: {status}: {reason}")
