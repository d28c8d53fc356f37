"""Which REST paths are task watches (their permits come from the watchers' budget, not the requests')."""

from __future__ import annotations

from gateway.limits import is_task_watch


def test_video_and_reindex_event_streams_are_task_watches() -> None:
    assert is_task_watch("/v1/tasks/task_1/events")
    assert is_task_watch("/v1/collections/docs/reindex/reindex_1/events")


def test_other_paths_are_not() -> None:
    assert not is_task_watch("/v1/tasks/task_1")
    assert not is_task_watch("/v1/collections/docs/reindex/reindex_1")
    assert not is_task_watch("/v1/collections/docs/documents/events")
    assert not is_task_watch("/v1/collections/events")
