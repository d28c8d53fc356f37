"""`python -m bench` runs each part on its own: a part that fails is recorded with its error and keeps what it wrote."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from bench.__main__ import run_part
from bench.results import PartResult, Point, Target

ROUND = PartResult(
    part="broken",
    x_label="concurrency",
    throughput_unit="texts/s",
    points=[Point("gateway REST", 32, 480.0, 60.0, 80.0, samples=[480.0], extra={"errors": 0.0})],
    targets=[Target("throughput", ">= 400 texts/s", "480 texts/s", True)],
    notes=["partial: 1 of 3 rounds done"],
)


def install_part(monkeypatch: pytest.MonkeyPatch, *, writes: bool) -> None:
    """A part named `broken` that writes its first round (if `writes`) and then fails, as a dead server makes it."""

    async def run(run_dir: Path, *, runs: int, quick: bool) -> PartResult:
        if writes:
            ROUND.write(run_dir)
        raise RuntimeError("triton exited with -11 during the benchmark; see triton.log")

    monkeypatch.setitem(sys.modules, "bench.broken", types.SimpleNamespace(run=run))


async def test_a_part_that_fails_keeps_the_rounds_it_wrote_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_part(monkeypatch, writes=True)
    await run_part("broken", tmp_path, runs=3, quick=False, options={"data": tmp_path})
    result = PartResult.read(tmp_path / "broken.json")
    assert (result.points, result.targets) == (ROUND.points, ROUND.targets)
    partial, failed, took = result.notes
    assert partial == "partial: 1 of 3 rounds done"
    assert failed == "failed: RuntimeError: triton exited with -11 during the benchmark; see triton.log"
    assert took.startswith("part took ")


async def test_a_result_left_in_the_folder_by_an_earlier_run_is_not_taken_for_this_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ROUND.write(tmp_path)
    install_part(monkeypatch, writes=False)
    await run_part("broken", tmp_path, runs=3, quick=False, options={})
    result = PartResult.read(tmp_path / "broken.json")
    assert result.points == [] and result.targets == []
    assert result.notes[0].startswith("failed: RuntimeError: triton exited")
