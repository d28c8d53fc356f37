"""Task states, the ledger's compare-and-set loop, and the mapping of a request onto Pika's arguments."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.services.image_ledger import TaskLedger
from gateway.services.image_runner import backoff
from gateway.tasks.model import IllegalTransitionError, Task, TaskError, TaskState, can_move
from gateway.tasks.sqlite_store import SqliteTaskStore
from gateway.upstreams.image_api import pika_arguments, result_urls

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
    assert pika_arguments("p", negative_prompt=None, width=None, height=None, options={}) == {"prompt": "p"}
    wide = pika_arguments("p", negative_prompt="blur", width=1920, height=1080, options={"seed": 3})
    assert wide == {"prompt": "p", "negative_prompt": "blur", "aspect_ratio": "16:9", "resolution": "1080p", "seed": 3}
    tall = pika_arguments("p", negative_prompt=None, width=720, height=1280, options={"resolution": "1080p"})
    assert tall["aspect_ratio"] == "9:16" and tall["resolution"] == "1080p"
    assert pika_arguments("p", negative_prompt=None, width=512, height=512, options={})["aspect_ratio"] == "1:1"


def test_result_urls_read_single_files_and_lists() -> None:
    assert result_urls({"video": {"url": "v"}, "images": [{"url": "a"}, {"nope": 1}, "junk"]}) == ["v", "a"]
    assert result_urls({"seed": 1}) == []


def test_ledger_decides_again_on_the_fresh_record_when_another_writer_won(tmp_path: Path) -> None:
    async def scenario() -> None:
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

    asyncio.run(scenario())


def test_ledger_starts_from_a_known_record_and_trusts_no_change_only_on_a_fresh_read(tmp_path: Path) -> None:
    async def scenario() -> None:
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

    asyncio.run(scenario())
