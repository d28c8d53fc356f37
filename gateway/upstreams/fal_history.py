"""fal's Platform API request history, through which a job whose submit answer was lost can still be found.

    GET {base}/v1/models/requests/by-endpoint?endpoint_id=<model>&start=<ISO8601>&status=success
        &expand=payloads&limit=100[&cursor=<next_cursor>]
        -> {"items": [{"request_id", "endpoint_id", "sent_at", "started_at", "ended_at", "status_code",
                       "duration", "json_input", "json_output"}], "next_cursor": str | null, "has_more": bool}

(docs.fal.ai/platform-apis/v1/models/requests/by-endpoint). Its status filter knows only outcomes (success,
error, user_error) and it sorts by end time: fal lists a request once it has ended, so a job still running is
not in it yet. Only successful ones are asked for: a failed job costs nothing and its task may simply submit
again. One pooled session (another host than the queue's), and a deadline on the whole listing, pages included.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp.abc import AbstractResolver
from pydantic import SecretStr

from gateway.upstreams.fal import VideoTimeoutError, VideoUpstreamError, fal_call, json_object
from gateway.upstreams.pool import PooledSession

HISTORY_PATH = "/v1/models/requests/by-endpoint"
PAGE_SIZE = 100  # the most fal gives per page


@dataclass(frozen=True)
class FalRequestRecord:
    """One listed request. Times are Unix seconds; `sent_at` is when fal received it."""

    request_id: str
    sent_at: float | None
    started_at: float | None
    ended_at: float | None
    json_input: Any


class FalRequestHistory:
    """The history of one endpoint (`model_path`); use as an async context manager or call `aclose`."""

    def __init__(
        self,
        base_url: str = "https://api.fal.ai",
        api_key: SecretStr | None = None,
        model_path: str = "fal-ai/pika/v2.2/text-to-video",
        *,
        timeout_seconds: float = 5.0,
        max_pages: int = 10,
        user_agent: str = "ai-gateway",
        resolver: AbstractResolver | None = None,
    ) -> None:
        self._url = f"{base_url.rstrip('/')}{HISTORY_PATH}"
        self._api_key = api_key
        self._endpoint_id = model_path.strip("/")
        self._timeout = timeout_seconds
        self._max_pages = max_pages
        self._pool = PooledSession(
            max_connections=4,
            connect_seconds=timeout_seconds,
            read_seconds=timeout_seconds,
            resolver=resolver,
            headers={"User-Agent": user_agent},
        )

    async def __aenter__(self) -> FalRequestHistory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def succeeded_since(self, start: float) -> list[FalRequestRecord]:
        """The endpoint's successful requests listed from `start` (Unix seconds) on, with their inputs. Raises
        the video upstream errors; more than `max_pages` pages is an error too (the caller cannot tell then)."""
        try:
            async with asyncio.timeout(self._timeout):
                return await self._pages(start)
        except TimeoutError as exc:
            raise VideoTimeoutError("video upstream history did not answer in time") from exc

    async def _pages(self, start: float) -> list[FalRequestRecord]:
        params = {
            "endpoint_id": self._endpoint_id,
            "start": datetime.fromtimestamp(start, UTC).isoformat().replace("+00:00", "Z"),
            "status": "success",
            "expand": "payloads",
            "limit": str(PAGE_SIZE),
        }
        records: list[FalRequestRecord] = []
        for _ in range(self._max_pages):
            page = json_object(await fal_call(self._pool, self._api_key, "GET", self._url, params=params), "history")
            items = page.get("items")
            if not isinstance(items, list):
                raise VideoUpstreamError("video upstream history answer lacks items")
            records.extend(record for item in items if (record := _record(item)) is not None)
            cursor = page.get("next_cursor")
            if not page.get("has_more") or not isinstance(cursor, str) or not cursor:
                return records
            params["cursor"] = cursor
        raise VideoUpstreamError(f"video upstream history has more than {self._max_pages * PAGE_SIZE} requests")


def _record(item: Any) -> FalRequestRecord | None:
    if not isinstance(item, dict) or not isinstance(item.get("request_id"), str) or not item["request_id"]:
        return None
    return FalRequestRecord(
        item["request_id"],
        _timestamp(item.get("sent_at")),
        _timestamp(item.get("started_at")),
        _timestamp(item.get("ended_at")),
        item.get("json_input"),
    )


def _timestamp(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
