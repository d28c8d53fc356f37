"""The video benchmark (part `video`): gateway settings, metric reading, targets, and one quick end-to-end run."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bench import video
from bench.gateway_metrics import metric
from bench.processes import ServerProcess
from bench.results import Point
from bench.run_stats import RunStats
from bench.stack import Endpoint
from bench.video.completion import CompletionRun
from bench.video.plan import API_KEY, COMPLETION_TASKS, JOB_SECONDS, RATES
from bench.video.report import completion_row, targets
from bench.video.servers import gateway_env

METRICS = """\
# HELP gateway_video_tasks Unfinished video tasks in the store by state (seen by this replica).
# TYPE gateway_video_tasks gauge
gateway_video_tasks{state="pending"} 2.0
gateway_video_tasks{state="processing"} 5.0
# HELP gateway_video_callbacks_total Webhook calls received, by result.
# TYPE gateway_video_callbacks_total counter
gateway_video_callbacks_total{result="applied"} 140.0
gateway_video_callbacks_total{result="duplicate"} 3.0
# HELP gateway_video_tasks_completed_by_polling_total Tasks whose webhook never came.
# TYPE gateway_video_tasks_completed_by_polling_total counter
gateway_video_tasks_completed_by_polling_total 60.0
"""


def test_metric_sums_the_samples_with_matching_labels() -> None:
    assert metric(METRICS, "gateway_video_tasks", state="processing") == 5.0
    assert metric(METRICS, "gateway_video_tasks") == 7.0
    assert metric(METRICS, "gateway_video_callbacks_total", result="applied") == 140.0
    assert metric(METRICS, "gateway_video_tasks_completed_by_polling_total") == 60.0
    assert metric(METRICS, "gateway_video_polls_total") == 0.0


def test_the_gateway_reaches_the_simulator_and_its_quota_is_above_the_load(tmp_path: Path) -> None:
    pika = Endpoint(ServerProcess("pika", ["true"], log_dir=tmp_path), "", "http://127.0.0.1:9200")
    env = gateway_env(pika, None)
    assert env["VIDEO_BASE_URL"] == "http://127.0.0.1:9200" and env["VIDEO_API_KEY"] == API_KEY
    assert env["VIDEO_WEBHOOK_JWKS_URL"] == "http://127.0.0.1:9200/.well-known/jwks.json"
    assert float(env["VIDEO_SUBMITS_PER_SECOND"]) > max(RATES)
    assert float(env["VIDEO_CALLBACK_GRACE_SECONDS"]) > JOB_SECONDS[False]  # only late webhooks are polled
    assert "REDIS_URL" not in env
    assert gateway_env(pika, "redis://127.0.0.1:6390/0")["REDIS_URL"] == "redis://127.0.0.1:6390/0"


def completion(latencies: list[float], lost: int, outcomes: dict[str, int]) -> CompletionRun:
    stats = RunStats(elapsed=4.0, latencies=latencies, errors=lost)
    return CompletionRun(stats, Counter(outcomes), wall_seconds=9.0, by_polling=60.0, callbacks_applied=140.0)


def test_targets_take_p99_at_200_per_s_for_each_store_and_count_every_lost_task() -> None:
    points = [
        Point("SQLite task store", 50.0, 50.0, 2.0, 6.0),
        Point("SQLite task store", 200.0, 198.0, 3.0, 9.5, samples=[198.0, 199.0, 197.0]),
        Point("Redis task store", 200.0, 150.0, 30.0, 250.0, samples=[150.0]),
    ]
    runs = [
        completion([6.0] * 200, 0, {"completed": 200}),
        completion([6.0] * 199, 1, {"completed": 199, "failed: timeout": 1}),
    ]
    found = targets(points, runs)
    assert [(t.name, t.met) for t in found] == [
        ("image submit p99 at 200 requests/s (SQLite task store)", True),
        ("image submit p99 at 200 requests/s (Redis task store)", False),
        ("lost video tasks with 30% of webhooks lost", False),
    ]
    assert found[0].measured == "9.5 ms (median of 3 runs)"
    assert found[2].measured == "1 of 400 over 2 runs (failed: timeout: 1)"


def test_the_completion_row_takes_medians_and_sums_the_lost_tasks() -> None:
    row = completion_row([completion([5.0, 6.0, 7.0], 0, {}), completion([5.0, 8.0, 9.0], 2, {})])
    assert row["completion p50 s"] == 7.0 and row["lost (all runs)"] == 2 and row["tasks"] == 4
    assert row["found by polling"] == 60.0 and row["wall clock s"] == 9.0


@pytest.mark.slow
async def test_quick_run_measures_submits_and_completion_end_to_end(tmp_path: Path) -> None:
    result = await video.run(tmp_path, runs=1, quick=True)
    systems = {point.system for point in result.points}
    assert "SQLite task store" in systems
    assert {point.x for point in result.points} == set(RATES)
    assert all(point.extra["errors"] == 0 and point.throughput > 0 for point in result.points)
    lost = next(t for t in result.targets if t.name.startswith("lost"))
    assert lost.met, lost.measured  # every task ends, webhook or not
    row = result.table[-1]
    assert row["tasks"] == COMPLETION_TASKS[True] and row["found by polling"] > 0
