"""`python -m bench history`: every run under bench/results/, a table per part, read from what the bench writes.

The runs are made by the bench's own writers (`PartResult.write`, `write_report`, the parts' target builders), so
a change to the saved format that the history does not follow fails here.
"""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench.__main__ import main as bench_main
from bench.chat.report import at_least_times, at_most
from bench.embeddings.report import latency_target, ratio_target
from bench.history import main as history_main
from bench.report import write_report
from bench.results import PartResult, Point
from bench.soak import report as soak_report
from bench.soak.records import Evidence, Slo

MACHINE = {
    "cpu": "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz",
    "cores": 2,
    "memory_gib": 23.5,
    "python": "3.11.9",
    "platform": "Linux-6.1-x86_64",
}
SHOWN_MACHINE = "Intel Xeon Platinum 8375C, 2 cores, 23.5 GiB"
REFERENCE = Point("in-process INT8", 32, 600.0, 50.0, 70.0, samples=[600.0, 600.0, 600.0])


def embeddings(gateway_samples: list[float], p99_samples: list[float]) -> PartResult:
    gateway = Point("gateway REST", 32, gateway_samples[1], 60.0, 90.0, samples=gateway_samples)
    at_8 = Point("gateway REST", 8, 360.0, 20.0, p99_samples[1], p99_samples=p99_samples)
    return PartResult(
        part="embeddings",
        x_label="concurrency",
        throughput_unit="texts/s",
        targets=[
            ratio_target("REST vs in-process best", gateway, REFERENCE, 0.85, "the best in-process"),
            latency_target("REST p99, concurrency 8", at_8, 50, digits=1),
        ],
    )


def chat(added_p50_ms: float) -> PartResult:
    return PartResult(
        part="chat",
        x_label="concurrency",
        throughput_unit="requests/s",
        targets=[
            at_most("added TTFT p50, concurrency 1", added_p50_ms, 2),
            at_least_times("requests/s vs LiteLLM", 1899.0, 115.0, 3),
        ],
    )


def gpu(throughputs: list[float]) -> PartResult:
    points = [Point("triton gpu", batch, rate, 5.0, 9.0) for batch, rate in zip((1, 8), throughputs, strict=True)]
    return PartResult(part="gpu", x_label="batch size (texts)", throughput_unit="texts/s", points=points)


def bench_run(results: Path, name: str, *parts: PartResult) -> Path:
    """A folder as `python -m bench` leaves it: each part's JSON, then the report with `results.json`."""
    folder = results / name
    for part in parts:
        part.write(folder)
    write_report(folder, MACHINE)
    return folder


@pytest.fixture
def results(tmp_path: Path) -> Path:
    # written out of time order: the history sorts by the run's time, not by when the folder was made
    bench_run(tmp_path, "20261206T075700Z", embeddings([520.0, 540.0, 560.0], [35.0, 38.9, 52.0]), chat(2.5))
    caches = PartResult("caches", x_label="", throughput_unit="", notes=["failed: RuntimeError: simulator exited"])
    bench_run(tmp_path, "20261204T100000Z", embeddings([470.0, 480.0, 490.0], [35.0, 38.9, 36.0]), chat(1.33), caches)
    # an older version's run, interrupted before its report: no results.json, a target without `met`, an old field
    old = embeddings([470.0, 480.0, 490.0], [35.0, 38.9, 36.0]).targets[0]
    target = {"name": old.name, "goal": old.goal, "measured": old.measured}
    saved = {"part": "embeddings", "version": 1, "targets": [target]}
    (tmp_path / "20261201T000000Z").mkdir()
    (tmp_path / "20261201T000000Z" / "embeddings.json").write_text(json.dumps(saved))
    old_name = PartResult("images", "requests/s", "requests/s", targets=[at_most("submit p99", 2.8, 10)])
    old_name.write(tmp_path / "20261201T000000Z")  # a part's earlier name: read, shown under that name
    # cut off while writing: nothing readable in it
    (tmp_path / "20261205T000000Z").mkdir()
    (tmp_path / "20261205T000000Z" / "results.json").write_text('{"machine": {"cpu": "Intel')
    # `make eval-cache`'s folder is no bench run
    (tmp_path / "cache-eval").mkdir()
    (tmp_path / "cache-eval" / "thresholds.json").write_text("{}")
    return tmp_path


def history(results: Path, capsys: pytest.CaptureFixture[str], *options: str) -> str:
    assert bench_main(["history", "--results", str(results), *options]) == 0
    return capsys.readouterr().out


def rows(output: str, part: str) -> list[list[str]]:
    """The part's table, each row cut into its cells (columns are two or more spaces apart)."""
    block = output.split(f"== {part} ==\n", 1)[1].split("\n\n", 1)[0]
    return [re.split(r"\s{2,}", line) for line in block.splitlines() if not line.startswith("  ")]


def test_each_part_lists_its_runs_in_time_order_with_figures_and_verdicts(
    results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = history(results, capsys)
    assert output.index("== embeddings ==") < output.index("== chat ==") < output.index("== caches ==")
    assert rows(output, "embeddings") == [
        ["run (UTC)", "machine", "status", "met", "T1", "T2"],
        ["2026-12-01 00:00", "?", "ok", "0/1", "worst 0.78 x of 3 runs ?"],
        ["2026-12-04 10:00", SHOWN_MACHINE, "ok", "1/2", "worst 0.78 x of 3 runs !", "worst 38.9 ms of 3 runs"],
        ["2026-12-06 07:57", SHOWN_MACHINE, "ok", "1/2", "worst 0.87 x of 3 runs", "worst 52.0 ms of 3 runs !"],
    ]
    assert "  T1: REST vs in-process best (goal >= 0.85 x the best in-process)" in output
    assert "  T2: REST p99, concurrency 8 (goal <= 50 ms, every run)" in output
    assert rows(output, "chat")[1:] == [
        ["2026-12-04 10:00", SHOWN_MACHINE, "ok", "2/2", "1.33 ms", "16.51 x"],
        ["2026-12-06 07:57", SHOWN_MACHINE, "ok", "1/2", "2.50 ms !", "16.51 x"],
    ]
    assert rows(output, "caches")[1:] == [["2026-12-04 10:00", SHOWN_MACHINE, "failed", "-"]]
    assert rows(output, "images")[1:] == [["2026-12-01 00:00", "?", "ok", "1/1", "2.80 ms"]]


def test_a_folder_with_nothing_readable_is_skipped_and_named_and_other_folders_are_ignored(
    results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = history(results, capsys)
    skipped = output.split("skipped (nothing readable):\n", 1)[1].splitlines()
    assert len(skipped) == 1 and skipped[0].startswith("  20261205T000000Z: results.json: JSONDecodeError")
    assert "2026-12-05" not in output.split("skipped")[0] and "cache-eval" not in output


def test_a_part_without_targets_shows_each_systems_peak_throughput(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    PartResult("chat", "concurrency", "requests/s", targets=[at_most("p50", 1.0, 2)]).write(tmp_path / "run")
    gpu([120.0, 950.0]).write(tmp_path / "run")
    (tmp_path / "run" / "chat.json").write_text("[not json")  # the part's own file broken: the run keeps the rest
    output = history(tmp_path, capsys)
    assert rows(output, "gpu")[0][-1] == "triton gpu, peak texts/s" and rows(output, "gpu")[1][-1] == "950.0"
    assert "== chat ==" not in output and "  run: chat.json: JSONDecodeError" in output


def test_the_soak_names_the_slos_it_missed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for plot in ("plot_latency", "plot_errors", "plot_rss", "plot_redis_memory"):
        monkeypatch.setattr(soak_report, plot, lambda *args: None)  # the figures are not what is read here
    slos = [Slo(f"availability fault {n}", "0 failed", "0 failed", True) for n in range(12)]
    slos += [
        Slo("latency p99 search", "<= 350 ms", "359 ms", False, "latency"),
        Slo("capacity", "reported", "45.6 requests/s held", False, "capacity"),  # reported, never judged
    ]
    out = tmp_path / "20261206T210700Z" / "soak"
    out.mkdir(parents=True)
    soak_report.write_report(out, Evidence([], [], 0.0, 0.0), slos, [], {"notes": [], "options": {}})
    assert rows(history(tmp_path, capsys), "soak") == [
        ["run (UTC)", "machine", "status", "met", "not met"],
        ["2026-12-06 21:07", "?", "ok", "12/13", "latency p99 search"],
    ]


def test_a_folder_named_by_hand_takes_its_place_by_when_it_was_written(
    results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = bench_run(results, "after-the-fix", chat(0.9))  # `python -m bench chat --out bench/results/after-the-fix`
    written = datetime(2026, 12, 5, 12, 0, tzinfo=UTC).timestamp()
    os.utime(folder, (written, written))
    assert [row[0] for row in rows(history(results, capsys, "--part", "chat"), "chat")[1:]] == [
        "2026-12-04 10:00",
        "2026-12-05 12:00 (after-the-fix)",
        "2026-12-06 07:57",
    ]


def test_part_and_last_narrow_the_history(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = history(results, capsys, "--part", "embeddings", "--last", "2")
    assert [row[0] for row in rows(output, "embeddings")[1:]] == ["2026-12-04 10:00", "2026-12-06 07:57"]
    assert "== chat ==" not in output
    assert "(no runs)" in history(results, capsys, "--part", "keys")


def test_json_carries_every_run_and_its_targets(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = json.loads(history(results, capsys, "--json", "--part", "chat"))
    assert [run["run"] for run in saved["runs"]] == ["20261204T100000Z", "20261206T075700Z"]  # the runs with chat
    latest = saved["runs"][-1]
    assert latest["machine"] == MACHINE and list(latest["parts"]) == ["chat"]
    assert [target["met"] for target in latest["parts"]["chat"]["targets"]] == [False, True]
    assert saved["skipped"][0].startswith("20261205T000000Z")


def test_a_missing_results_folder_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert history_main(["--results", str(tmp_path / "absent")]) == 1
    assert "no results folder" in capsys.readouterr().err
