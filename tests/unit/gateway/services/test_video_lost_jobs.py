"""Finding the job of a submit whose answer was lost in fal's request history: what matches (equal input, sent
within the call's window, not another task's), one job per task, and the runner's fallback when the history
cannot be read."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.quota import LocalQuotaLimiter
from gateway.services.video.ledger import TaskLedger
from gateway.services.video.lost_jobs import LostJobFinder
from gateway.services.video.runner import VideoTaskRunner
from gateway.services.video.steps import RunnerConfig
from gateway.tasks.model import Task, TaskState
from gateway.tasks.sqlite_store import SqliteTaskStore
from gateway.upstreams.fal import FalSubmission, VideoUnavailableError
from gateway.upstreams.fal_history import FalRequestRecord
from gateway.upstreams.webhooks import WebhookUrls
from tests.unit.gateway.services.test_video_tasks import StoreCalls, Upstream, new_task, until

BEGAN = 1_000.0  # when the lost submit call began (`Task.submitting_since`)
ARGUMENTS = {"prompt": "a red fox", "seed": 3}


def listed(
    request_id: str, sent_after: float | None, arguments: Any = None, started_after: float = 1.0
) -> FalRequestRecord:
    sent = None if sent_after is None else BEGAN + sent_after
    return FalRequestRecord(
        request_id, sent, BEGAN + started_after, BEGAN + 2.0, ARGUMENTS if arguments is None else arguments
    )


class History:
    """Stands in for fal's request history: lists `records`, or fails like an unreachable host while `down`."""

    def __init__(self, *records: FalRequestRecord) -> None:
        self.records = list(records)
        self.down = False
        self.starts: list[float] = []

    async def succeeded_since(self, start: float) -> list[FalRequestRecord]:
        self.starts.append(start)
        if self.down:
            raise VideoUnavailableError("video upstream unreachable: ClientConnectorError")
        return [record for record in self.records if (record.ended_at or 0.0) >= start]


def lost(**changes: Any) -> Task:
    """A task whose attempt 1 began at BEGAN and never got its answer."""
    fields: dict[str, Any] = {"arguments": ARGUMENTS, "attempt": 1, "submitting_since": BEGAN}
    return new_task(**{**fields, **changes})


def finder_on(store: SqliteTaskStore, history: History | None) -> LostJobFinder:
    ledger = TaskLedger(store, retention_seconds=60.0)
    return LostJobFinder(history, ledger, submit_call_seconds=35.0, claim_seconds=120.0)


@pytest.mark.parametrize(
    ("record", "found"),
    [
        (listed("job-1", 0.4), True),
        (listed("job-1", None, started_after=0.6), True),  # no receipt time: its start stands in
        (listed("job-1", 0.4, {"prompt": "a red fox"}), False),  # another input
        (listed("job-1", 0.4, {**ARGUMENTS, "seed": 4}), False),
        (listed("job-1", -30.0), False),  # sent before the call began
        (listed("job-1", 60.0), False),  # sent after the call could have ended
    ],
    ids=["equal-input", "start-time", "other-input", "other-seed", "too-early", "too-late"],
)
async def test_a_lost_job_matches_on_equal_input_sent_within_the_call(
    tmp_path: Path, record: FalRequestRecord, found: bool
) -> None:
    store = SqliteTaskStore(tmp_path / "tasks.sqlite3")
    history = History(record)
    assert await finder_on(store, history).find(lost()) == ("job-1" if found else None)
    assert history.starts and history.starts[0] < BEGAN  # listed from a little before the call
    await store.aclose()


async def test_a_job_another_task_tracks_is_not_taken(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "tasks.sqlite3")
    finder = finder_on(store, History(listed("job-1", 0.2)))
    assert await finder.claim("task_other", "job-1")  # got it the normal way, or adopted it first
    assert await finder.find(lost()) is None
    await store.aclose()


async def test_of_several_matches_each_task_adopts_one_and_keeps_it(tmp_path: Path) -> None:
    """Two tasks with equal input lost in one crash: the first takes the earliest job, the second the other,
    asking fal once between them; a lookup again (another replica, a retry) finds the same job."""

    store = SqliteTaskStore(tmp_path / "tasks.sqlite3")
    history = History(listed("job-late", 0.9), listed("job-early", 0.3))
    finder = finder_on(store, history)
    first, second = lost(), lost()
    assert await finder.find(first) == "job-early"
    assert await finder.find(second) == "job-late"
    assert await finder.find(first) == "job-early"
    assert await finder.find(lost()) is None  # a third has nothing left to adopt
    assert len(history.starts) == 1
    await store.aclose()


async def test_a_history_that_cannot_be_read_finds_nothing(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "tasks.sqlite3")
    history = History(listed("job-1", 0.2))
    history.down = True
    finder = finder_on(store, history)
    assert await finder.find(lost()) is None
    assert await finder.find(lost()) is None and len(history.starts) == 1  # the failure serves a while too
    assert await finder_on(store, None).find(lost()) is None  # no history configured: not asked
    await store.aclose()


def runner_on(store: StoreCalls, upstream: Upstream, history: History | None) -> VideoTaskRunner:
    ledger = TaskLedger(store, retention_seconds=60.0)  # type: ignore[arg-type]
    config = RunnerConfig(scan_interval_seconds=60, unknown_submit_wait_seconds=30.0, lost_job_lookup_seconds=2.0)
    urls = WebhookUrls(None, None)  # no webhooks: the history alone can name the job
    return VideoTaskRunner(ledger, upstream, LocalQuotaLimiter(), urls, config, owner="replica-2", history=history)


@pytest.mark.parametrize(
    ("call_age", "history_state", "outcome"),
    [
        (1.0, "lists-it", "adopted"),
        (31.0, "lists-it", "adopted"),  # the last lookup, before a new attempt
        (1.0, "not-yet", "looks-again"),
        (1.0, "down", "looks-again"),
        (31.0, "not-yet", "submitted-again"),
        (31.0, "down", "submitted-again"),  # the fallback: as without a history
    ],
)
async def test_a_task_whose_submit_outcome_is_unknown_adopts_its_job_from_the_history_or_submits_again(
    tmp_path: Path, call_age: float, history_state: str, outcome: str
) -> None:
    store = StoreCalls(SqliteTaskStore(tmp_path / "tasks.sqlite3"))
    upstream = Upstream()
    now = time.time()
    began = now - call_age
    history = History()
    if history_state != "not-yet":
        history.records.append(FalRequestRecord("job-7", began + 0.5, began + 1.0, min(now, began + 20.0), ARGUMENTS))
    history.down = history_state == "down"
    runner = runner_on(store, upstream, history)
    await runner.start()
    task = lost(created_at=began, updated_at=began, deadline_at=now + 60, submitting_since=began)
    await store.create(task)
    runner.submitter.enqueue(task.id)
    await until(lambda: "release_lease" in store.calls or store.calls.count("save") >= 1)
    await until(lambda: store.calls.count("save") >= (2 if outcome == "submitted-again" else 1))
    await runner.aclose()
    stored = await store.store.get(task.id)
    assert stored is not None
    if outcome == "adopted":
        assert upstream.submitted == [] and stored.state == TaskState.PROCESSING
        assert stored.upstream_request_id == "job-7" and stored.submitting_since is None
        assert stored.poll_after is not None and stored.poll_after <= time.time()  # it has ended: polled now
    elif outcome == "looks-again":
        assert upstream.submitted == [] and stored.state == TaskState.PENDING
        assert stored.next_attempt_at == pytest.approx(time.time() + 2.0, abs=1.0)  # the next lookup
    else:
        assert upstream.submitted == [ARGUMENTS] and stored.attempt == 2
        assert stored.state == TaskState.PROCESSING and stored.upstream_request_id == "1"
    await store.store.aclose()


class AdoptedFirst(Upstream):
    """Accepts the job, and before its answer gets back the job's webhook has the task adopt it (as
    `VideoService.handle_callback` records an adoption)."""

    def __init__(self, store: SqliteTaskStore) -> None:
        super().__init__()
        self.store = store

    async def submit(self, arguments: dict[str, Any], webhook_url: str | None = None) -> FalSubmission:
        submission = await super().submit(arguments, webhook_url)
        (task,) = await self.store.due(math.inf)
        adopted = task.moved(
            TaskState.PROCESSING, time.time(), upstream_request_id=submission.request_id, submitting_since=None
        )
        assert await self.store.save(adopted)
        return submission


@pytest.mark.parametrize("first", ["answer", "webhook"])
async def test_a_job_submitted_the_normal_way_is_claimed_by_its_task(tmp_path: Path, first: str) -> None:
    """So that a task with equal input whose own submit was lost cannot adopt it from the history. The claim
    comes with the record of the job (no store call of its own); a job its webhook adopted first (that record
    then writes nothing) is claimed on its own."""

    sqlite = SqliteTaskStore(tmp_path / "tasks.sqlite3")
    store = StoreCalls(sqlite)
    runner = runner_on(store, Upstream() if first == "answer" else AdoptedFirst(sqlite), History())
    await runner.start()
    now = time.time()
    task = new_task(arguments=ARGUMENTS, created_at=now, updated_at=now, deadline_at=now + 60)
    await store.create(task)
    runner.submitter.enqueue(task.id)
    # The submit lease, the task, the attempt, the job (after the adoption: refused, read again, no change).
    calls = ["create", "acquire_lease", "get", "save", "save"]
    calls += [] if first == "answer" else ["get", "acquire_lease"]
    await until(lambda: store.calls == calls)
    await runner.aclose()
    assert store.calls == calls
    stored = await sqlite.get(task.id)
    assert stored is not None and stored.state == TaskState.PROCESSING and stored.upstream_request_id == "1"
    assert not await sqlite.acquire_lease("job:1", "task_other", 10.0)
    assert await sqlite.acquire_lease("job:1", task.id, 10.0)
    await sqlite.aclose()
