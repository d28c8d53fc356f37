"""Video tasks across real `python -m gateway` processes: a SIGKILL mid-flight, and two replicas on one Redis.

Each gateway is a subprocess on free ports in front of the Pika (fal queue) simulator, which runs in this
process (`pika_simulator`), so the tests read what the upstream saw from `.stats`. No Triton is needed: the
gateways point at a closed port, so /readyz answers 503 and the tests wait on /healthz instead. Every
process's output goes to a log file under `tmp_path`; its tail is part of every assertion message.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections import Counter
from contextlib import closing
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest

from localtriton.ports import free_port
from tests.helpers.gateway_processes import (
    Gateways,
    pika_variables,
    statuses,
    submit,
    wait_all_final,
)
from tests.helpers.metrics import metric
from tests.helpers.pika_fixtures import RunningPikaSimulator

pytestmark = pytest.mark.slow


def stored_records(path: Path) -> dict[str, dict[str, Any]]:
    """Every task record in the SQLite task store, read directly (for what the API does not show)."""
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT id, record FROM tasks").fetchall()
    return {str(task_id): json.loads(record) for task_id, record in rows}


def test_sigkill_with_20_tasks_in_flight_then_restart_finishes_every_task(
    pika_simulator: RunningPikaSimulator, gateways: Gateways, http: httpx.Client, tmp_path: Path
) -> None:
    pika_simulator.config.job_seconds = 2.0
    pika_simulator.config.submit_delay_seconds = 0.2  # submits are in flight when the process dies
    pika_simulator.config.callback_delay_seconds = 0.3
    pika_simulator.config.callback_attempts = 3  # then the webhook is given up: "lost", only polling finds it
    pika_simulator.config.callback_retry_seconds = 0.1
    database = tmp_path / "tasks" / "tasks.sqlite3"
    port = free_port()
    variables = pika_variables(
        pika_simulator,
        GATEWAY_PUBLIC_URL=f"http://127.0.0.1:{port}",
        TASKS_SQLITE_PATH=str(database),
        TASKS_LEASE_SECONDS="2",
        TASKS_SCAN_INTERVAL_SECONDS="0.1",
        VIDEO_CALLBACK_GRACE_SECONDS="1",
        VIDEO_POLL_INITIAL_SECONDS="0.2",
        VIDEO_POLL_MAX_SECONDS="1",
        VIDEO_MAX_CONCURRENT_SUBMITS="2",
        VIDEO_SUBMITS_PER_SECOND="10",  # 20 tasks take ~2 s to submit: some are still pending at the kill
        VIDEO_TASK_TIMEOUT_SECONDS="60",
        VIDEO_UNKNOWN_SUBMIT_WAIT_SECONDS="3",  # the lost jobs' webhooks are given up while the process is down
    )
    first = gateways.create("first", port, variables).start()
    stats = pika_simulator.stats

    def diagnostics() -> str:
        return (
            f"simulator: submitted={stats.submitted} callbacks_sent={stats.callbacks_sent} "
            f"callbacks_failed={stats.callbacks_failed} status_polls={stats.status_polls} "
            f"jobs={dict(stats.jobs_by_state)}\n{gateways.tails()}"
        )

    task_ids = [submit(http, first, f"scene {i}", diagnostics) for i in range(20)]
    deadline = time.monotonic() + 10
    while True:
        counts = Counter(task["status"] for task in statuses(http, first, task_ids).values())
        if counts["processing"] >= 4 and counts["pending"] >= 4:
            break
        assert counts["pending"] >= 4, f"every task was submitted before the kill: {dict(counts)}\n{diagnostics()}"
        assert time.monotonic() < deadline, f"tasks not submitted: {dict(counts)}\n{diagnostics()}"
        time.sleep(0.02)
    killed_wall = time.time()
    first.kill()
    killed_at = {"submitted": stats.submitted, **counts}

    # While the gateway is down, jobs end and their webhooks fail every attempt: the simulator gives them up.
    # At most VIDEO_MAX_CONCURRENT_SUBMITS of those jobs can be orphans (see below), so with 3 given up at
    # least one belongs to a task whose end only polling can find.
    deadline = time.monotonic() + 10
    while stats.callbacks_failed < 3:
        assert time.monotonic() < deadline, f"no webhooks lost while the gateway was down\n{diagnostics()}"
        time.sleep(0.05)

    restarted = time.monotonic()
    second = gateways.create("second", port, variables).start()  # same env, same SQLite file, same port
    tasks = wait_all_final(http, second, task_ids, 30, diagnostics)
    recovery_seconds = time.monotonic() - restarted

    for task in tasks.values():
        assert task["status"] == "completed" or (task["status"] == "failed" and task["error"]["code"]), (
            f"{task}\n{diagnostics()}"
        )
    assert Counter(task["status"] for task in tasks.values())["completed"] == 20, f"{tasks}\n{diagnostics()}"
    # A submit in flight when the process died may have reached the simulator without its answer reaching the
    # store: the task is still pending with a call of unknown outcome. Its job's webhook was given up while the
    # process was down, so after VIDEO_UNKNOWN_SUBMIT_WAIT_SECONDS the new process submits it again
    # (test_video_submit_crash.py has fal retry its webhooks as long as it does, and no task runs twice).
    assert stats.submitted >= 20, diagnostics()
    assert stats.submitted <= 20 + 2, f"more resubmissions than submits in flight at the kill\n{diagnostics()}"
    by_polling = metric(http, second.base_url, "gateway_video_tasks_completed_by_polling_total")
    records = [stored_records(database)[task_id] for task_id in task_ids]
    completed_by = Counter(record["completed_by"] for record in records)
    # The restarted process's counter covers the tasks it ended (none can end before the kill: jobs take 2 s).
    ended_after_restart = sum(r["completed_by"] == "polling" and r["ended_at"] > killed_wall for r in records)
    assert by_polling == ended_after_restart == completed_by["polling"], f"{completed_by}\n{diagnostics()}"
    assert by_polling >= 1, f"lost webhooks, yet no task was finished by polling: {completed_by}\n{diagnostics()}"
    print(
        f"at the kill: {killed_at}; after the restart all 20 ended in {recovery_seconds:.1f} s; "
        f"upstream submissions {stats.submitted}; webhooks given up {stats.callbacks_failed}; "
        f"completed by polling {by_polling:g}, by callback {completed_by['callback']}"
    )


def watch(url: str, events: list[tuple[float, str]], errors: list[BaseException]) -> None:
    """Read the SSE stream at `url` into `events` as (arrival time, data), until [DONE]."""
    try:
        with httpx.Client(timeout=httpx.Timeout(10, read=15)) as client, client.stream("GET", url) as stream:
            if stream.status_code != 200:
                raise AssertionError(f"events answered {stream.status_code}")
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    events.append((time.monotonic(), line[len("data: ") :]))
                    if line == "data: [DONE]":
                        return
    except BaseException as exc:
        errors.append(exc)


def test_two_replicas_on_redis_callback_on_one_replica_completes_the_task_watched_on_the_other(
    pika_simulator: RunningPikaSimulator, gateways: Gateways, http: httpx.Client, redis_url: str
) -> None:
    pika_simulator.config.job_seconds = 1.5
    port_a, port_b = free_port(), free_port()
    # Every webhook lands on B, whichever replica submits the job (B's scanner may win the submit lease).
    common = pika_variables(
        pika_simulator,
        REDIS_URL=redis_url,
        GATEWAY_PUBLIC_URL=f"http://127.0.0.1:{port_b}",
        TASKS_SCAN_INTERVAL_SECONDS="0.1",
        VIDEO_CALLBACK_GRACE_SECONDS="30",  # no polling: only B's webhook can end the task
    )
    a = gateways.create("a", port_a, common)
    b = gateways.create("b", port_b, common)
    for replica in (a.launch(), b.launch()):  # both start at once
        replica.wait_healthy()
    stats = pika_simulator.stats

    def diagnostics() -> str:
        return f"simulator: submitted={stats.submitted} callbacks_sent={stats.callbacks_sent}\n{gateways.tails()}"

    task_id = submit(http, a, "a red fox in snow", diagnostics)
    events: list[tuple[float, str]] = []
    errors: list[BaseException] = []
    watcher = threading.Thread(target=watch, args=(f"{a.base_url}/v1/tasks/{task_id}/events", events, errors))
    watcher.start()
    completed_on_b = None
    deadline = time.monotonic() + 15
    while completed_on_b is None:
        if http.get(f"{b.base_url}/v1/tasks/{task_id}").json()["status"] == "completed":
            completed_on_b = time.monotonic()
        assert time.monotonic() < deadline, f"task not completed\n{diagnostics()}"
        time.sleep(0.02)
    watcher.join(timeout=15)
    assert not watcher.is_alive(), f"the watcher on A saw no [DONE]: {events}\n{diagnostics()}"
    assert not errors, f"{errors!r}\n{diagnostics()}"

    assert events and events[-1][1] == "[DONE]", f"{events}\n{diagnostics()}"
    seen = [json.loads(data)["status"] for _, data in events[:-1]]
    assert seen[0] in ("pending", "processing"), f"the watcher connected after the end: {seen}"
    assert seen[-1] == "completed", f"{seen}\n{diagnostics()}"
    completed_on_a = next(at for at, data in events if data != "[DONE]" and json.loads(data)["status"] == "completed")
    # B's change reaches A's watcher through Redis pub/sub, not A's 2 s re-read.
    print(f"A's watcher saw B's change {completed_on_a - completed_on_b:+.3f} s after B's GET did; events: {seen}")
    assert completed_on_a - completed_on_b < 1.0, f"A's watcher saw it {completed_on_a - completed_on_b:.2f} s late"
    assert http.get(f"{a.base_url}/v1/tasks/{task_id}").json()["status"] == "completed"
    applied_b = metric(http, b.base_url, "gateway_video_callbacks_total", result="applied")
    applied_a = metric(http, a.base_url, "gateway_video_callbacks_total", result="applied")
    assert applied_b >= 1 and applied_a == 0, f"applied: a={applied_a} b={applied_b}\n{diagnostics()}"
    assert stats.status_polls == 0 and stats.submitted == 1, diagnostics()


def test_two_replicas_on_redis_poll_each_task_one_at_a_time(
    pika_simulator: RunningPikaSimulator, gateways: Gateways, http: httpx.Client, redis_url: str
) -> None:
    pika_simulator.config.job_seconds = 3.0
    common = pika_variables(
        pika_simulator,
        REDIS_URL=redis_url,  # no GATEWAY_PUBLIC_URL: no webhooks, tasks are polled from the start
        TASKS_SCAN_INTERVAL_SECONDS="0.05",
        VIDEO_POLL_INITIAL_SECONDS="0.4",
        VIDEO_POLL_MAX_SECONDS="0.4",  # a fixed interval
    )
    replicas = [gateways.create(name, free_port(), common) for name in ("a", "b")]
    for replica in [replica.launch() for replica in replicas]:
        replica.wait_healthy()
    stats = pika_simulator.stats

    def diagnostics() -> str:
        return f"simulator: submitted={stats.submitted} status_polls={stats.status_polls}\n{gateways.tails()}"

    task_ids = [submit(http, replicas[i % 2], f"scene {i}", diagnostics) for i in range(8)]
    tasks = wait_all_final(http, replicas[0], task_ids, 20, diagnostics)
    assert all(task["status"] == "completed" for task in tasks.values()), f"{tasks}\n{diagnostics()}"
    assert stats.submitted == 8, f"a task was submitted twice\n{diagnostics()}"

    polls = {request_id: list(times) for request_id, times in stats.polls_by_request.items()}
    assert len(polls) == 8 and all(len(times) >= 3 for times in polls.values()), diagnostics()
    # Two uncoordinated pollers would both poll a due task within one scan interval (0.05 s) of each other.
    gaps = {
        request_id: min(later[0] - earlier[0] for earlier, later in pairwise(times))
        for request_id, times in polls.items()
    }
    too_close = {request_id: round(gap, 3) for request_id, gap in gaps.items() if gap < 0.3}
    assert not too_close, f"polled twice within 0.3 s: {too_close}\n{diagnostics()}"
    agents = Counter(agent for times in polls.values() for _, agent in times)
    print(f"polls by replica: {dict(agents)}; smallest gap between two polls of a job: {min(gaps.values()):.3f} s")
    assert len(agents) == 2, f"expected polls from both replicas, got {agents}"
    assert all(agent.startswith("ai-gateway (") for agent in agents), agents
