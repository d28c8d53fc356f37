"""Which REST paths are task watches (their permits come from the watchers' budget, not the requests'), and where a
reconnecting watcher resumes."""

from __future__ import annotations

from gateway.limits import is_task_watch
from gateway.routes.task_events import resume_point


def test_video_and_reindex_event_streams_are_task_watches() -> None:
    assert is_task_watch("/v1/tasks/task_1/events")
    assert is_task_watch("/v1/collections/docs/reindex/reindex_1/events")


def test_other_paths_are_not() -> None:
    assert not is_task_watch("/v1/tasks/task_1")
    assert not is_task_watch("/v1/collections/docs/reindex/reindex_1")
    assert not is_task_watch("/v1/collections/docs/documents/events")
    assert not is_task_watch("/v1/collections/events")


def test_a_resume_point_is_an_event_id_and_anything_else_none() -> None:
    assert [resume_point(value) for value in ("7", " 12 ", "0")] == [7, 12, 0]
    assert [resume_point(value) for value in (None, "", "-1", "abc", "1.5", "\u00b3", "٣")] == [None] * 7


def test_a_resume_point_longer_than_any_of_our_ids_is_none_not_an_error() -> None:
    assert resume_point("9" * 19) == 9_999_999_999_999_999_999
    assert [resume_point(value) for value in ("9" * 20, "1" * 5000)] == [None, None]  # int() refuses 4,301 digits
