"""No paid job twice: a gateway SIGKILLed while submits to fal are in flight, then restarted.

The Pika simulator answers each submit after 0.5 s (the job exists once it answers, whether or not the answer
arrives); 40 tasks are accepted and the gateway is killed 0.75 s after the last 202, with
`VIDEO_MAX_CONCURRENT_SUBMITS` (4) calls in flight. The restarted gateway finds those tasks with a submit of
unknown outcome. With webhooks, the lost jobs' webhooks (fal retries them while the gateway is down) adopt
them before the wait for them ends: no task runs twice upstream; with no wait (and no request history), the tasks
are submitted again and the lost jobs are cancelled when their webhooks come. Without webhooks, fal's request
history (the simulator's, listing a job once it has ended) names the lost jobs within the wait: adopted, none
runs twice.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from localtriton.ports import free_port
from tests.helpers.gateway_processes import Gateways, pika_variables, submit, wait_all_final
from tests.helpers.metrics import metric
from tests.helpers.pika_fixtures import RunningPikaSimulator

pytestmark = pytest.mark.slow

TASKS = 40
CONCURRENT_SUBMITS = 4


@pytest.mark.parametrize(
    ("store", "webhooks", "wait", "job_seconds"),
    [
        ("sqlite", True, 15.0, 1.0),
        ("redis", True, 15.0, 1.0),
        ("sqlite", True, 0.0, 1.0),
        ("sqlite", False, 15.0, 1.0),
        ("redis", False, 15.0, 1.0),
        ("sqlite", False, 2.0, 6.0),
    ],
    ids=[
        "sqlite-webhooks",
        "redis-webhooks",
        "sqlite-webhooks-no-wait",
        "sqlite-polling",
        "redis-polling",
        "sqlite-polling-jobs-outlast-the-wait",
    ],
)
def test_sigkill_mid_submit_then_restart_runs_no_task_twice_upstream(
    store: str,
    webhooks: bool,
    wait: float,
    job_seconds: float,
    pika_simulator: RunningPikaSimulator,
    gateways: Gateways,
    http: httpx.Client,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    simulated = pika_simulator.config
    simulated.job_seconds = job_seconds
    simulated.submit_delay_seconds = 0.5
    simulated.callback_attempts = 80  # fal retries a webhook for a long time: ~20 s covers the restart
    simulated.callback_retry_seconds = 0.25
    port = free_port()
    variables = pika_variables(
        pika_simulator,
        TASKS_LEASE_SECONDS="2",
        TASKS_SCAN_INTERVAL_SECONDS="0.1",
        VIDEO_MAX_CONCURRENT_SUBMITS=str(CONCURRENT_SUBMITS),
        VIDEO_CALLBACK_GRACE_SECONDS="5",
        VIDEO_POLL_INITIAL_SECONDS="0.3",
        VIDEO_POLL_MAX_SECONDS="1",
        VIDEO_UNKNOWN_SUBMIT_WAIT_SECONDS=str(wait),
        VIDEO_LOST_JOB_LOOKUP_SECONDS="1",
        VIDEO_TASK_TIMEOUT_SECONDS="120",
    )
    if not wait:
        variables["VIDEO_PLATFORM_URL"] = ""  # webhooks alone: the lost jobs are cancelled when they come
    if webhooks:
        variables["GATEWAY_PUBLIC_URL"] = f"http://127.0.0.1:{port}"
    if store == "redis":
        variables["REDIS_URL"] = request.getfixturevalue("redis_url")
    else:
        variables["TASKS_SQLITE_PATH"] = f"{tmp_path}/tasks.sqlite3"
    stats = pika_simulator.stats
    jobs = pika_simulator.app.state.simulator.jobs

    def diagnostics() -> str:
        return f"simulator: submitted={stats.submitted} cancels={stats.cancels}\n{gateways.tails()}"

    first = gateways.create("first", port, variables).start()
    task_ids = [submit(http, first, f"scene {i}", diagnostics) for i in range(TASKS)]
    time.sleep(0.75)
    first.kill()
    second = gateways.create("second", port, variables).start()  # same store, same port
    tasks = wait_all_final(http, second, task_ids, 60, diagnostics)

    assert all(task["status"] == "completed" for task in tasks.values()), f"{tasks}\n{diagnostics()}"
    per_task = Counter(job.body["prompt"] for job in list(jobs.values()))
    duplicates = sum(count - 1 for count in per_task.values())
    tracked = {url.split("/")[-2] for task in tasks.values() for url in task["urls"]}  # .../{request_id}/video.mp4
    orphans = [request_id for request_id in list(jobs) if request_id not in tracked]
    cancelled = set(stats.cancelled_requests)
    adopted = metric(http, second.base_url, "gateway_video_callbacks_total", result="adopted")
    found = metric(http, second.base_url, "gateway_video_lost_job_lookups_total", result="found")
    print(
        f"{store}, webhooks {'on' if webhooks else 'off'}, wait {wait:g} s: "
        f"{len(jobs)} jobs upstream for {TASKS} tasks, {duplicates} duplicates, "
        f"{len(orphans)} orphans ({len(cancelled & set(orphans))} cancelled), {adopted:g} adopted by their webhook, "
        f"{found:g} from the request history"
    )
    assert len(per_task) == TASKS, diagnostics()
    if webhooks and wait:
        assert duplicates == 0 and not orphans, f"{per_task}\n{diagnostics()}"
        # a lost job is adopted by its webhook or found in the request history first, whichever comes sooner
        assert adopted + found >= 1, f"no submit was in flight at the kill\n{diagnostics()}"
    elif webhooks:
        # Submitted again once the lease lapsed, before the lost jobs' webhooks came: each is cancelled on sight.
        assert duplicates == len(orphans) <= CONCURRENT_SUBMITS, f"{per_task}\n{diagnostics()}"
        deadline = time.monotonic() + 10
        while not set(orphans) <= set(stats.cancelled_requests):
            assert time.monotonic() < deadline, f"orphans {orphans} not all cancelled\n{diagnostics()}"
            time.sleep(0.1)
    elif job_seconds < wait:
        # The lost jobs have ended before the restarted gateway looks: the history names each one.
        assert duplicates == 0 and not orphans, f"{per_task}\n{diagnostics()}"
        assert found >= 1 and stats.history_calls >= 1, f"no submit was in flight at the kill\n{diagnostics()}"
    else:
        # The residual window: fal lists a job once it has ended, so one still running when the wait is over is
        # not found, and its task is submitted again (a paid duplicate, over by then: nothing to cancel).
        assert 1 <= duplicates == len(orphans) <= CONCURRENT_SUBMITS, f"{per_task}\n{diagnostics()}"
        assert stats.history_calls >= 1, diagnostics()
