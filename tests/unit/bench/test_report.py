"""The report: targets with met / not met, one table per part, throughput and p99 plots per swept part."""

from __future__ import annotations

import json
from pathlib import Path

from bench.report import write_report
from bench.results import PartResult, Point, Target, summarize
from bench.run_stats import RunStats, percentile

MACHINE = {"cpu": "Test CPU", "cores": 2, "memory_gib": 24.0, "python": "3.11", "platform": "linux"}


def test_percentile_interpolates_and_summarize_takes_medians_over_runs() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and percentile([5.0], 99) == 5.0
    runs = [
        RunStats(elapsed=2.0, latencies=[0.01] * 10, items=100),
        RunStats(elapsed=1.0, latencies=[0.03] * 10, items=100),
    ]
    runs.append(RunStats(elapsed=4.0, latencies=[0.02] * 10, items=100, errors=1))
    point = summarize("gateway", 8, runs)
    assert point.throughput == 50.0 and point.samples == [50.0, 100.0, 25.0]
    assert round(point.p99_ms, 6) == 20.0 and point.extra["errors"] == 1.0


def test_report_lists_targets_tables_and_plots(tmp_path: Path) -> None:
    swept = PartResult(part="embeddings", x_label="concurrency", throughput_unit="texts/s")
    for system, scale in (("gateway REST", 1.0), ("infinity-emb", 0.3)):
        swept.points += [Point(system, x, 100 * scale * x, 5.0, 10.0 * x) for x in (1, 8, 32)]
    swept.table = [{"system": "gateway REST", "concurrency": 32, "texts/s": 3200.0}]
    swept.targets = [
        Target("REST vs ceiling", ">= 0.85 x", "0.91 x", True),
        Target("p99 at 8", "<= 60 ms", "80 ms", False),
    ]
    swept.write(tmp_path)
    PartResult(part="caches", x_label="", throughput_unit="", notes=["failed: boom"]).write(tmp_path)
    report = write_report(tmp_path, MACHINE).read_text()
    assert "Test CPU, 2 cores" in report
    assert "| embeddings | REST vs ceiling | >= 0.85 x | 0.91 x | met |" in report
    assert "| embeddings | p99 at 8 | <= 60 ms | 80 ms | **not met** |" in report
    assert "| gateway REST | 32 | 3200.0 |" in report and "- failed: boom" in report
    assert report.index("## embeddings") < report.index("## caches")
    for name in ("embeddings-throughput.png", "embeddings-p99.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "caches-throughput.png").exists()
    combined = json.loads((tmp_path / "results.json").read_text())
    assert [part["part"] for part in combined["parts"]] == ["embeddings", "caches"]
