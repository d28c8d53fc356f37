"""What `python -m bench` shows while it runs: on a terminal one bar over parts times runs (a part that reports its
rounds moves it round by round, the others when they end), with the `part …` log lines above it; piped, only the
log lines. The parts are fakes."""

from __future__ import annotations

import asyncio
import io
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from tqdm import tqdm

from bench.__main__ import run_part, run_parts
from bench.progress import PartProgress
from bench.results import PartResult
from tests.helpers.terminal import Terminal, console_fixture

RUNS = 3


@pytest.fixture(autouse=True)
def parts(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """`bench.rounds` reports two of its rounds (its bar counts seen after each), `bench.quiet` none, and
    `bench.stopped` is stopped by a signal."""
    seen: dict[str, list[int]] = {"rounds": []}

    async def rounds(run_dir: Path, *, runs: int, quick: bool, progress: PartProgress) -> PartResult:
        for _ in range(2):
            progress.advance()
            seen["rounds"].append(progress.bar.n)
        return PartResult("rounds", x_label="", throughput_unit="")

    async def quiet(run_dir: Path, *, runs: int, quick: bool) -> PartResult:
        return PartResult("quiet", x_label="", throughput_unit="")

    async def stopped(run_dir: Path, *, runs: int, quick: bool) -> PartResult:
        raise asyncio.CancelledError

    for name, run in (("rounds", rounds), ("quiet", quiet), ("stopped", stopped)):
        monkeypatch.setitem(sys.modules, f"bench.{name}", SimpleNamespace(run=run))
    return seen


console = console_fixture("bench", "%(name)s %(message)s")


def test_a_part_moves_the_bar_by_its_rounds_and_the_rest_of_its_share_when_it_ends(
    tmp_path: Path, parts: dict[str, list[int]]
) -> None:
    with tqdm(total=2 * RUNS, file=Terminal()) as bar:
        first, second = PartProgress(bar, RUNS), PartProgress(bar, RUNS)
        asyncio.run(run_part("rounds", tmp_path, runs=RUNS, quick=False, options={}, progress=first))
        assert parts["rounds"] == [1, 2] and bar.n == RUNS  # the round it did not report: counted at its end
        asyncio.run(run_part("quiet", tmp_path, runs=RUNS, quick=False, options={"data": None}, progress=second))
        assert bar.n == 2 * RUNS  # a part that takes no `progress` is not given one; its share is filled at its end
        second.advance()
        assert bar.n == 2 * RUNS  # rounds beyond a part's share move nothing


def test_on_a_terminal_one_bar_counts_parts_times_runs_with_the_log_lines_above_it(
    tmp_path: Path, console: Callable[[io.StringIO], None]
) -> None:
    terminal = Terminal()
    console(terminal)
    assert run_parts(["rounds", "quiet"], tmp_path, runs=RUNS, quick=False, options={}) is None
    screen = [line.split("\r")[-1].rstrip() for line in terminal.getvalue().split("\n")]
    assert screen[:2] == ["bench part rounds (1 of 2)", "bench part quiet (2 of 2)"], screen
    assert re.fullmatch(r"bench: 100%\|.*\| 6/6 \[\d\d:\d\d<00:00, +[\d.]+(s/)?runs?(/s)?\]", screen[2]), screen
    for frame in (r"0/6 \[.*, rounds\]", r"3/6 \[.*, quiet\]"):  # each part named, and its share counted at its end
        assert re.search(frame, terminal.getvalue()), frame


def test_piped_only_the_log_lines_are_printed(tmp_path: Path, console: Callable[[io.StringIO], None]) -> None:
    piped = io.StringIO()
    console(piped)
    assert run_parts(["rounds", "quiet"], tmp_path, runs=RUNS, quick=False, options={}) is None
    assert piped.getvalue().splitlines() == ["bench part rounds (1 of 2)", "bench part quiet (2 of 2)"]


def test_a_run_a_signal_stops_names_the_part_and_closes_the_bar(
    tmp_path: Path, console: Callable[[io.StringIO], None]
) -> None:
    terminal = Terminal()
    console(terminal)
    assert run_parts(["quiet", "stopped", "rounds"], tmp_path, runs=1, quick=False, options={}) == "stopped"
    screen = [line.split("\r")[-1].rstrip() for line in terminal.getvalue().split("\n")]
    assert "bench part rounds (3 of 3)" not in screen
    assert re.fullmatch(r"bench:  33%\|.*\| 1/3 \[.*, stopped\]", screen[-2]), screen
