"""The re-index scanner survives any exception: a job left unfinished (its process gone) is still taken up by
the scan after one that raised something other than a `GatewayError`. Real embedded store and SQLite task store;
the task store's `due` raises once."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from gateway import metrics
from gateway.search.embedded import EmbeddedStore
from gateway.services.embeddings import EmbeddingService
from gateway.services.search_reindex import ReindexJobs
from gateway.settings import LimitSettings
from gateway.tasks.model import Task, TaskState
from gateway.tasks.sqlite_store import SqliteTaskStore
from tests.unit.gateway.services.test_search_reindex import DOCUMENTS, SwitchingEmbedder, stored_collection


class FailingOnceTaskStore(SqliteTaskStore):
    """The SQLite task store whose first `due` raises a bug's exception, as no store error would."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.scans = 0

    async def due(self, now: float, limit: int | None = None) -> list[Task]:
        self.scans += 1
        if self.scans == 1:
            raise RuntimeError("an unexpected failure in the scan")
        return await super().due(now, limit)


def runner(tasks: SqliteTaskStore, store: EmbeddedStore, owner: str) -> ReindexJobs:
    embeddings = EmbeddingService(SwitchingEmbedder("rev2"), None, LimitSettings())
    return ReindexJobs(
        tasks, store, embeddings, owner=owner, retention_seconds=60, lease_seconds=5, scan_interval_seconds=0.05
    )


async def test_the_next_scan_runs_the_job_after_a_scan_raised_a_non_gateway_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    internal = metrics.REINDEX_SCAN_FAILURES.labels(reason="internal")

    with caplog.at_level(logging.DEBUG, logger="gateway.tasks.scanner"):
        store = EmbeddedStore(tmp_path / "search")
        await stored_collection(store, "rev1")
        # A job accepted by a process that then went away before running it: only a scan takes it up.
        crashed = runner(SqliteTaskStore(str(tmp_path / "jobs.sqlite3")), store, "test")
        task, created = await crashed.submit("c")
        await crashed.aclose()  # cancels the job before its first step
        assert created and (await crashed.get("c", task.id)).state == TaskState.PENDING

        tasks = FailingOnceTaskStore(str(tmp_path / "jobs.sqlite3"))
        jobs = runner(tasks, store, "test")
        failed_before = internal._value.get()
        await jobs.start()
        try:
            for _ in range(500):
                task = await jobs.get("c", task.id)
                if task.state.terminal:
                    break
                await asyncio.sleep(0.01)
            assert task.state == TaskState.COMPLETED
            assert (task.result or {})["documents"] == DOCUMENTS
            assert tasks.scans >= 2
            assert internal._value.get() == failed_before + 1
            assert (await store.get_collection("c")).reindex_task is None
        finally:
            await jobs.aclose()
            await store.aclose()
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert [record.getMessage() for record in errors] == ["re-index job scan failed; retrying at each scan"]
    assert errors[0].exc_info is not None and "an unexpected failure in the scan" in str(errors[0].exc_info[1])
