"""Task states, the ledger's compare-and-set loop, the runner's store round trips per submit, and the mapping of
a request onto Pika's arguments."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from gateway.errors import UpstreamUnavailableError
from gateway.quota import LocalQuotaLimiter
from gateway.services.video.ledger import TaskLedger
from gateway.services.video.runner import VideoTaskRunner
from gateway.services.video.steps import RunnerConfig, backoff
from gateway.tasks.base import TaskStoreError
from gateway.tasks.model import IllegalTransitionError, Task, TaskError, TaskState, can_move
from gateway.tasks.sqlite_store import SqliteTaskStore
from gateway.upstreams.fal import FalStatus, FalSubmission, VideoTimeoutError, result_urls, text_to_video_arguments
from gateway.upstreams.webhooks import WebhookUrls
from tests.helpers import conditions

P, R, C, F, X = (
    TaskState.PENDING,
    TaskState.PROCESSING,
    TaskState.COMPLETED,
    TaskState.FAILED,
    TaskState.CANCELLED,
)


def new_task(**changes: object) -> Task:
    fields: dict[str, object] = {
        "id": Task.new_id(),
        "state": P,
        "arguments": {"prompt": "p"},
        "created_at": 100.0,
        "updated_at": 100.0,
        "deadline_at": 220.0,
    }
    return Task(**{**fields, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("current", "new", "allowed"),
    [
        (P, P, True),
        (P, R, True),
        (P, C, True),  # an early webhook may end a task before its submission was recorded
        (P, F, True),
        (P, X, True),
        (R, R, True),
        (R, C, True),
        (R, F, True),
        (R, X, True),
        (R, P, False),
        (C, C, False),
        (C, F, False),
        (F, C, False),
        (X, R, False),
        (X, X, False),
    ],
)
def test_states_only_move_forward(current: TaskState, new: TaskState, allowed: bool) -> None:
    assert can_move(current, new) is allowed
    task = new_task(state=current)
    if allowed:
        moved = task.moved(new, 101.0)
        assert moved.state == new and moved.version == task.version + 1 and moved.updated_at == 101.0
    else:
        with pytest.raises(IllegalTransitionError, match=f"from {current.value} to {new.value}"):
            task.moved(new, 101.0)


def test_a_record_survives_its_json_form() -> None:
    task = new_task(state=F, error=TaskError("timeout", "too slow"), result={"video": {"url": "u"}}, polls=3)
    assert Task.from_json(task.to_json()) == task


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff(0.5, 3.0, attempt) for attempt in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff(1.0, 10.0, 10_000) == 10.0


def test_pika_arguments_derive_aspect_ratio_and_resolution_and_let_the_client_override() -> None:
    assert text_to_video_arguments("p", negative_prompt=None, width=None, height=None, options={}) == {"prompt": "p"}
    wide = text_to_video_arguments("p", negative_prompt="blur", width=1920, height=1080, options={"seed": 3})
    assert wide == {"prompt": "p", "negative_prompt": "blur", "aspect_ratio": "16:9", "resolution": "1080p", "seed": 3}
    tall = text_to_video_arguments("p", negative_prompt=None, width=720, height=1280, options={"resolution": "1080p"})
    assert tall["aspect_ratio"] == "9:16" and tall["resolution"] == "1080p"
    assert (
        text_to_video_arguments("p", negative_prompt=None, width=512, height=512, options={})["aspect_ratio"] == "1:1"
    )


def test_result_urls_read_single_files_and_lists() -> None:
    assert result_urls({"video": {"url": "v"}, "images": [{"url": "a"}, {"nope": 1}, "junk"]}) == ["v", "a"]
    assert result_urls({"seed": 1}) == []


async def test_ledger_decides_again_on_the_fresh_record_when_another_writer_won(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "tasks.sqlite3", clock=lambda: 150.0)
    ledger = TaskLedger(store, retention_seconds=60.0, clock=lambda: 150.0)
    task, created = await store.create(new_task())
    assert created
    seen: list[TaskState] = []

    def complete(current: Task) -> Task | None:
        seen.append(current.state)
        if current.state.terminal:
            return None
        return ledger.ended(current, C, result={"ok": True})

    racing = task.moved(R, 120.0)  # another replica records the submission first
    assert await store.save(racing)
    await store.save(task.moved(R, 121.0))  # a stale write (same base version) is refused
    final, changed = await ledger.change(task.id, complete)
    assert changed and final.state == C and final.version == racing.version + 1
    assert final.expires_at == 150.0 + 60.0 and final.ended_at == 150.0
    assert seen == [R]
    again, changed = await ledger.change(task.id, complete)  # a duplicate webhook
    assert not changed and again == final and seen == [R, C]
    await store.aclose()


async def test_ledger_starts_from_a_known_record_and_trusts_no_change_only_on_a_fresh_read(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "tasks.sqlite3", clock=lambda: 150.0)
    ledger = TaskLedger(store, retention_seconds=60.0, clock=lambda: 150.0)
    reads: list[str] = []
    read = store.get

    async def counted_get(task_id: str) -> Task | None:
        reads.append(task_id)
        return await read(task_id)

    store.get = counted_get  # type: ignore[method-assign]
    task, _ = await store.create(new_task())

    # Nobody wrote since the caller read it: saved without another read.
    processing, changed = await ledger.change(task.id, lambda t: t.moved(R, 120.0), known=task)
    assert changed and processing.state == R and reads == []

    # Stale (still pending here): "no change" on it is not trusted; decided again on the fresh record.
    def complete_once_processing(current: Task) -> Task | None:
        return ledger.ended(current, C) if current.state == R else None

    final, changed = await ledger.change(task.id, complete_once_processing, known=task)
    assert changed and final.state == C and final.version == processing.version + 1 and reads == [task.id]

    # Stale with a change: the compare-and-set refuses it and the fresh record decides (no change).
    again, changed = await ledger.change(
        task.id, lambda t: None if t.state.terminal else t.moved(R, 130.0), known=processing
    )
    assert not changed and again == final and reads == [task.id, task.id]
    await store.aclose()


class StoreCalls:
    """A real SQLite store whose lease, read and write calls are recorded by name."""

    RECORDED = ("create", "get", "save", "acquire_lease", "release_lease")

    def __init__(self, store: SqliteTaskStore) -> None:
        self.store = store
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)
        if name not in self.RECORDED:
            return method

        async def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return await method(*args, **kwargs)

        return recorded


class Upstream:
    """Stands in for fal's queue API: accepts every job, or refuses it with a 503 while `down`."""

    def __init__(self) -> None:
        self.down = False
        self.submitted: list[dict[str, Any]] = []
        self.cancelled: list[str] = []

    async def submit(self, arguments: dict[str, Any], webhook_url: str | None = None) -> FalSubmission:
        if self.down:
            raise UpstreamUnavailableError("fal answered 503")
        self.submitted.append(arguments)
        return self.submission_of(str(len(self.submitted)))

    def submission_of(self, request_id: str) -> FalSubmission:
        base = f"https://queue.fal.run/pika/requests/{request_id}"
        return FalSubmission(request_id, f"{base}/status", base, f"{base}/cancel")

    async def status(self, submission_or_status_url: FalSubmission | str) -> FalStatus:
        return FalStatus("IN_PROGRESS")

    async def result(self, response_url: str) -> dict[str, Any]:
        return {}

    async def cancel(self, cancel_url: str) -> bool:
        self.cancelled.append(cancel_url)
        return True


async def submitted(store: StoreCalls, runner: VideoTaskRunner, task: Task, leased_at: float | None) -> Task:
    """Create `task` as the submit route does (with the runner's lease), queue it, and wait for the record of its
    submit's outcome (the second save; the first records the attempt before the call)."""
    lease = runner.submitter.submit_lease(task.id)
    assert await store.create(task, lease if leased_at is not None else None) == (task, True)
    if leased_at is None:
        runner.submitter.enqueue(task.id)
    else:
        runner.submitter.enqueue_created(task, leased_at)
    async with asyncio.timeout(5):
        while store.calls.count("save") < 2:
            await asyncio.sleep(0.001)
    stored = await store.store.get(task.id)
    assert stored is not None
    return stored


@pytest.mark.parametrize("lease_age", ["fresh", "stale", "none"])
async def test_the_replica_that_created_a_task_submits_it_without_another_lease_or_read(
    tmp_path: Path, lease_age: str
) -> None:
    """Per task: the lease comes with the create, the record is the one just created, and the lease of a task
    that is processing lapses rather than being released. A stale or missing lease: taken and read first."""
    store = StoreCalls(SqliteTaskStore(tmp_path / "tasks.sqlite3"))
    ledger = TaskLedger(store, retention_seconds=60.0)  # type: ignore[arg-type]
    upstream = Upstream()
    config = RunnerConfig(scan_interval_seconds=60)
    urls = WebhookUrls("https://gw.example/v1/callbacks/video", None)
    runner = VideoTaskRunner(ledger, upstream, LocalQuotaLimiter(), urls, config, owner="replica-1")
    await runner.start()
    now = time.time()
    task = new_task(created_at=now, updated_at=now, deadline_at=now + 60)
    leased_at = {"fresh": time.monotonic(), "stale": time.monotonic() - config.lease_seconds, "none": None}
    stored = await submitted(store, runner, task, leased_at[lease_age])
    await runner.aclose()
    assert stored.state == R and stored.upstream_request_id == "1" and upstream.submitted == [task.arguments]
    first_steps = [] if lease_age == "fresh" else ["acquire_lease", "get"]
    assert store.calls == ["create", *first_steps, "save", "save"]  # the attempt, then its outcome
    assert not await store.acquire_lease(f"submit:{task.id}", "replica-2", 30)  # still held: it lapses
    await store.aclose()


async def test_a_task_left_pending_by_a_failed_submit_gets_its_lease_released(tmp_path: Path) -> None:
    store = StoreCalls(SqliteTaskStore(tmp_path / "tasks.sqlite3"))
    ledger = TaskLedger(store, retention_seconds=60.0)  # type: ignore[arg-type]
    upstream = Upstream()
    upstream.down = True
    config = RunnerConfig(scan_interval_seconds=60)
    runner = VideoTaskRunner(ledger, upstream, LocalQuotaLimiter(), WebhookUrls(None, None), config, owner="replica-1")
    await runner.start()
    now = time.time()
    task = new_task(created_at=now, updated_at=now, deadline_at=now + 60)
    stored = await submitted(store, runner, task, time.monotonic())
    while "release_lease" not in store.calls:
        await asyncio.sleep(0.001)
    await runner.aclose()
    assert stored.state == P and stored.submit_attempts == 1 and stored.next_attempt_at is not None
    assert store.calls == ["create", "save", "save", "release_lease"]
    assert await store.acquire_lease(f"submit:{task.id}", "replica-2", 30)  # free for any replica's retry
    await store.aclose()


class HeldQuota:
    """A quota whose slot is granted only when the test opens the gate (a long wait for the upstream's quota)."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.gate = asyncio.Event()

    @contextlib.asynccontextmanager
    async def slot(self, estimated_tokens: int = 0) -> AsyncIterator[object]:
        self.waiting.set()
        await self.gate.wait()
        yield object()


class SlowUpstream(Upstream):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.calling = asyncio.Event()

    async def submit(self, arguments: dict[str, Any], webhook_url: str | None = None) -> FalSubmission:
        self.calling.set()
        await asyncio.sleep(self.seconds)
        return await super().submit(arguments, webhook_url)


class SlowCancels(Upstream):
    async def cancel(self, cancel_url: str) -> bool:
        await asyncio.sleep(0.05)
        return await super().cancel(cancel_url)


class BrokenSaves(StoreCalls):
    """Saves after the first (the record of the submit attempt) fail (the store is down), or with `hang`,
    never return (a store that hangs)."""

    def __init__(self, store: SqliteTaskStore, *, hang: bool = False) -> None:
        super().__init__(store)
        self.hang = hang

    def __getattr__(self, name: str) -> Any:
        if name != "save" or "save" not in self.calls:
            return super().__getattr__(name)

        async def broken(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            if self.hang:
                await asyncio.Event().wait()
            raise TaskStoreError("task store unavailable")

        return broken


async def started_runner(store: StoreCalls, upstream: Upstream, quota: Any = None, **config: Any) -> VideoTaskRunner:
    """A started runner on `store` (no webhooks, no scans unless `config` says otherwise)."""
    ledger = TaskLedger(store, retention_seconds=60.0)  # type: ignore[arg-type]
    settings = RunnerConfig(**{"scan_interval_seconds": 60, **config})
    urls = WebhookUrls(None, None)
    runner = VideoTaskRunner(ledger, upstream, quota or LocalQuotaLimiter(), urls, settings, owner="replica-1")
    await runner.start()
    return runner


async def created(store: StoreCalls, runner: VideoTaskRunner, task_id: str | None = None) -> Task:
    """A new task, created with its submit lease and queued, as the submit route does."""
    now = time.time()
    task = new_task(id=task_id or Task.new_id(), created_at=now, updated_at=now, deadline_at=now + 60)
    await store.create(task, runner.submitter.submit_lease(task.id))
    runner.submitter.enqueue_created(task, time.monotonic())
    return task


# Steps here take microseconds: polled every 1 ms, so a test sees a state before the next step replaces it.
until = partial(conditions.until, timeout=5.0, poll_seconds=0.001)


@pytest.mark.parametrize("taken_over", [False, True], ids=["renewed", "taken-over"])
async def test_a_quota_wait_longer_than_the_lease_renews_it_or_gives_the_task_up(
    tmp_path: Path, taken_over: bool
) -> None:
    """After a quota wait longer than the lease, the lease is renewed and the task read again before the
    upstream call; if another replica took the lapsed lease meanwhile, this one does not submit."""
    store = StoreCalls(SqliteTaskStore(tmp_path / "tasks.sqlite3"))
    upstream, quota = Upstream(), HeldQuota()
    runner = await started_runner(store, upstream, quota, lease_seconds=0.3)
    task = await created(store, runner)
    lease = runner.submitter.submit_lease(task.id)
    await until(quota.waiting.is_set)
    await asyncio.sleep(0.35)  # the lease (0.3 s) has lapsed while the slot was awaited
    if taken_over:
        assert await store.acquire_lease(lease.name, "replica-2", 30)
    quota.gate.set()
    await until(lambda: "release_lease" in store.calls if taken_over else store.calls.count("save") == 2)
    await runner.aclose()
    stored = await store.store.get(task.id)
    assert stored is not None
    if taken_over:
        assert upstream.submitted == [] and stored.state == P
        assert store.calls == ["create", "acquire_lease", "acquire_lease", "release_lease"]
    else:
        assert upstream.submitted == [task.arguments] and stored.state == R
        assert store.calls == ["create", "acquire_lease", "get", "save", "save"]
    await store.aclose()


async def test_the_submit_lease_is_renewed_while_a_slow_upstream_call_runs(tmp_path: Path) -> None:
    """A submit call longer than the lease: no other replica can take the task (and submit it again) meanwhile."""
    store = StoreCalls(SqliteTaskStore(tmp_path / "tasks.sqlite3"))
    upstream = SlowUpstream(seconds=0.6)
    runner = await started_runner(store, upstream, lease_seconds=0.15)
    task = await created(store, runner)
    lease = runner.submitter.submit_lease(task.id)
    await until(upstream.calling.is_set)
    for _ in range(4):  # 0.4 s into the call: past the lease more than twice over
        await asyncio.sleep(0.1)
        assert not await store.store.acquire_lease(lease.name, "replica-2", 30)
    await until(lambda: store.calls.count("save") == 2)
    await runner.aclose()
    stored = await store.store.get(task.id)
    assert stored is not None and stored.state == R and upstream.submitted == [task.arguments]
    assert store.calls.count("acquire_lease") >= 3  # the renewals, one every third of the lease
    await store.aclose()


async def test_closing_lets_a_submit_at_the_upstream_record_its_job_and_cancels_one_waiting_for_quota(
    tmp_path: Path,
) -> None:
    store = StoreCalls(SqliteTaskStore(tmp_path / "tasks.sqlite3"))
    upstream = SlowUpstream(seconds=0.3)
    runner = await started_runner(store, upstream)
    task = await created(store, runner)
    await until(upstream.calling.is_set)
    await runner.aclose()  # while the upstream is answering
    stored = await store.store.get(task.id)
    assert stored is not None and stored.state == R and stored.upstream_request_id == "1"

    held = HeldQuota()  # never granted
    runner = await started_runner(store, upstream, held)
    await created(store, runner, "t-waiting")
    await until(held.waiting.is_set)
    started = time.monotonic()
    await runner.aclose()
    assert time.monotonic() - started < 1.0  # not drained: it had not reached the upstream
    assert upstream.submitted == [task.arguments]
    await store.aclose()


@pytest.mark.parametrize("hang", [False, True], ids=["store-down", "cut-off-on-close"])
async def test_a_job_whose_acceptance_cannot_be_recorded_is_cancelled(tmp_path: Path, hang: bool) -> None:
    """The task stays pending and will be submitted again; the untracked job must not run as well, also
    when the record is cut off by closing (the cancel is done before close returns)."""
    store = BrokenSaves(SqliteTaskStore(tmp_path / "tasks.sqlite3"), hang=hang)
    upstream = SlowCancels()
    runner = await started_runner(store, upstream)
    task = await created(store, runner)
    await until(lambda: store.calls.count("save") == 2)
    if not hang:
        await until(lambda: upstream.cancelled)
    await runner.aclose(drain_seconds=0.1)  # a hanging record never comes: cut off after the drain
    stored = await store.store.get(task.id)
    assert stored is not None and stored.state == P and stored.upstream_request_id is None
    assert stored.attempt == 1 and stored.submitting_since is not None  # recorded before the call
    assert upstream.submitted == [task.arguments]
    assert upstream.cancelled == ["https://queue.fal.run/pika/requests/1/cancel"]
    await store.aclose()


class RecordingUpstream(Upstream):
    """Records the webhook URL of each submit; `timeout` makes a submit time out (its outcome unknown)."""

    def __init__(self) -> None:
        super().__init__()
        self.webhook_urls: list[str | None] = []
        self.timeout = False

    async def submit(self, arguments: dict[str, Any], webhook_url: str | None = None) -> FalSubmission:
        self.webhook_urls.append(webhook_url)
        if self.timeout:
            raise VideoTimeoutError("video upstream did not answer in time")
        return await super().submit(arguments, webhook_url)


@pytest.mark.parametrize("call_age", [1.0, 31.0], ids=["within-the-wait", "after-the-wait"])
async def test_a_task_whose_last_submit_outcome_is_unknown_waits_for_its_webhook_before_a_new_attempt(
    tmp_path: Path, call_age: float
) -> None:
    """A replica died during attempt 1 (recorded, never answered): the next one leaves the task until 30 s after
    that call began (its job's webhook may still adopt it), then submits attempt 2 with its own webhook URL."""
    store = StoreCalls(SqliteTaskStore(tmp_path / "tasks.sqlite3"))
    upstream = RecordingUpstream()
    ledger = TaskLedger(store, retention_seconds=60.0)  # type: ignore[arg-type]
    config = RunnerConfig(scan_interval_seconds=60, unknown_submit_wait_seconds=30.0)
    urls = WebhookUrls("https://gw.example/v1/callbacks/video", None)
    runner = VideoTaskRunner(ledger, upstream, LocalQuotaLimiter(), urls, config, owner="replica-2")
    await runner.start()
    now = time.time()
    began = now - call_age
    task = new_task(created_at=began, updated_at=began, deadline_at=now + 60, attempt=1, submitting_since=began)
    await store.create(task)
    runner.submitter.enqueue(task.id)
    # Within the wait: the new due time saved and the lease released; after it: the attempt and its answer.
    await until(lambda: "release_lease" in store.calls if call_age < 30 else store.calls.count("save") == 2)
    await runner.aclose()
    stored = await store.store.get(task.id)
    assert stored is not None
    if call_age < 30:
        assert upstream.submitted == [] and stored.state == P
        assert stored.next_attempt_at == pytest.approx(began + 30.0)  # the scanner looks again then
    else:
        assert stored.state == R and stored.attempt == 2 and stored.submitting_since is None
        assert upstream.webhook_urls == [
            f"https://gw.example/v1/callbacks/video/{task.id}?attempt=2&token={urls.token(task.id, 2)}"
        ]
    await store.aclose()


async def test_a_submit_that_times_out_keeps_its_attempt_open_for_the_wait(tmp_path: Path) -> None:
    store = StoreCalls(SqliteTaskStore(tmp_path / "tasks.sqlite3"))
    upstream = RecordingUpstream()
    upstream.timeout = True
    runner = await started_runner(store, upstream, unknown_submit_wait_seconds=30.0)
    task = await created(store, runner)
    await until(lambda: "release_lease" in store.calls)
    await runner.aclose()
    stored = await store.store.get(task.id)
    assert stored is not None and stored.state == P and stored.attempt == 1
    assert stored.submitting_since is not None  # fal may have the job: its webhook may still come
    assert stored.next_attempt_at is not None and stored.next_attempt_at >= stored.submitting_since + 30.0
    await store.aclose()
