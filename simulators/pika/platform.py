"""fal's Platform API request history, as the simulator serves it from its jobs
(docs.fal.ai/platform-apis/v1/models/requests/by-endpoint):

    GET /v1/models/requests/by-endpoint?endpoint_id=<id>[,<id>...]&start=&end=&status=&request_id=
        &expand=payloads&sort_by=ended_at|duration&limit=1..100&cursor=<base64 page number>
    -> {"items": [{"request_id", "endpoint_id", "sent_at", "started_at", "ended_at", "status_code", "duration",
                   ["json_input", "json_output"]}], "next_cursor": str | null, "has_more": bool}

Its status filter knows only outcomes (success, error, user_error) and it sorts by end time, so a request is listed
once it has ended; `start`/`end` (ISO 8601, end exclusive; by default the last 24 hours) bound its end here.
Newest first. A bad parameter answers 422 as fal's validation does.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from simulators.pika.jobs import COMPLETED, FAILED, Job

PATH = "/v1/models/requests/by-endpoint"
STATUSES = ("success", "error", "user_error")
DAY_SECONDS = 24 * 3600.0


class InvalidQueryError(ValueError):
    """A query parameter fal would refuse (422); the message names it."""


def history_page(jobs: Iterable[Job], query: dict[str, list[str]]) -> dict[str, Any]:
    """One page of the ended jobs that `query` (each parameter's values, as repeated) selects."""
    endpoints = {value for raw in query.get("endpoint_id", []) for value in raw.split(",") if value}
    if not endpoints or len(endpoints) > 50:
        raise InvalidQueryError("endpoint_id: 1 to 50 endpoint ids are required")
    now = time.time()
    start = _moment(_one(query, "start"), "start", now - DAY_SECONDS)
    end = _moment(_one(query, "end"), "end", now)
    status = _one(query, "status")
    if status is not None and status not in STATUSES:
        raise InvalidQueryError(f"status: one of {', '.join(STATUSES)}")
    request_id = _one(query, "request_id")
    expand = {value for raw in query.get("expand", []) for value in raw.split(",") if value}
    sort_by = _one(query, "sort_by") or "ended_at"
    if sort_by not in ("ended_at", "duration"):
        raise InvalidQueryError("sort_by: ended_at or duration")
    limit = _limit(_one(query, "limit"))
    page = _page(_one(query, "cursor"))
    selected = [
        job
        for job in jobs
        if job.ended_at is not None
        and job.model_path in endpoints
        and start <= job.ended_at < end
        and (status is None or _status(job) == status)
        and (request_id is None or job.request_id == request_id)
    ]
    selected.sort(key=lambda job: (job.ended_at or 0.0) - (job.sent_at if sort_by == "duration" else 0.0))
    selected.reverse()
    chunk = selected[(page - 1) * limit : page * limit]
    has_more = page * limit < len(selected)
    return {
        "items": [_item(job, "payloads" in expand) for job in chunk],
        "next_cursor": base64.b64encode(str(page + 1).encode()).decode() if has_more else None,
        "has_more": has_more,
    }


def _status_code(job: Job) -> int:
    if job.state == COMPLETED:
        return 200
    return 500 if job.state == FAILED else 400  # cancelled: the result answers 400 too


def _status(job: Job) -> str:
    code = _status_code(job)
    return "success" if code < 400 else "user_error" if code < 500 else "error"


def _item(job: Job, payloads: bool) -> dict[str, Any]:
    ended_at = job.ended_at or job.sent_at
    item: dict[str, Any] = {
        "request_id": job.request_id,
        "endpoint_id": job.model_path,
        "sent_at": _iso(job.sent_at),
        "started_at": _iso(job.started_at if job.started_at is not None else ended_at),
        "ended_at": _iso(ended_at),
        "status_code": _status_code(job),
        "duration": round(ended_at - job.sent_at, 3),
    }
    if payloads:
        item["json_input"] = job.body
        item["json_output"] = job.result if job.state == COMPLETED else {"detail": job.error}
    return item


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat().replace("+00:00", "Z")


def _one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def _moment(value: str | None, name: str, default: float) -> float:
    if value is None:
        return default
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidQueryError(f"{name}: an ISO 8601 date or time") from exc
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _limit(value: str | None) -> int:
    if value is None:
        return 50
    if not value.isdigit() or not 1 <= int(value) <= 100:
        raise InvalidQueryError("limit: an integer from 1 to 100")
    return int(value)


def _page(cursor: str | None) -> int:
    if cursor is None:
        return 1
    try:
        page = int(base64.b64decode(cursor, validate=True).decode())
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidQueryError("cursor: not a cursor this API gave") from exc
    if page < 1:
        raise InvalidQueryError("cursor: not a cursor this API gave")
    return page
