"""GET /v1/usage: the usage record, summed per day and group (admins: every key; other keys: their own)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi.responses import JSONResponse

from gateway.keys.context import current_key
from gateway.protocol.openai import ErrorResponse
from gateway.routes import include
from gateway.usage.recorder import UsageRecorder
from gateway.usage.report import parse_group_by, parse_range, report, to_csv

router = APIRouter()

ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 429, 503)}


def usage_recorder(request: Request) -> UsageRecorder:
    recorder: UsageRecorder = request.app.state.usage
    return recorder


@router.get(
    "/v1/usage",
    responses={200: {"content": {"application/json": {}, "text/csv": {}}}, **ERRORS},  # type: ignore[dict-item]
)
async def get_usage(
    request: Request,
    start: str = Query(description="First UTC day, YYYY-MM-DD."),
    end: str = Query(description="Last UTC day, YYYY-MM-DD (inclusive)."),
    group_by: str | None = Query(None, description="team, key or model (comma-separated); unset: all three."),
) -> Response:
    first, last = parse_range(start, end)
    groups = parse_group_by(group_by)
    recorder = usage_recorder(request)
    await recorder.flush()  # this replica's records of answers already sent are in
    rows = await recorder.store.rows(first, last)
    key = current_key()
    if "admin" not in key.scopes:
        rows = [row for row in rows if row.key_id == key.id]
    data: list[dict[str, Any]] = report(rows, groups)
    if "text/csv" in request.headers.get("accept", ""):
        return Response(to_csv(data, groups), media_type="text/csv")
    return JSONResponse({"object": "list", "data": data})


def attach_router(app: FastAPI) -> None:
    include(app, router)
