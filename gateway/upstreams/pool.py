"""One pooled `aiohttp.ClientSession` per upstream client, for the process lifetime, writing strict JSON."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver


class PooledSession:
    """Made on first use, inside the running loop (a session belongs to the loop that made it).

    Timeouts: `read_seconds` bounds the wait for a pooled connection (connecting included), for the
    answer's headers and each later silence; `connect_seconds` bounds the TCP (and TLS) connect. The
    whole call's deadline is the caller's.
    """

    def __init__(
        self,
        *,
        max_connections: int,
        connect_seconds: float,
        read_seconds: float,
        resolver: AbstractResolver | None = None,  # where host names resolve (DNS by default)
        **session_options: Any,
    ) -> None:
        self._limit = max_connections
        self._resolver = resolver
        timeout = aiohttp.ClientTimeout(
            total=None, connect=read_seconds, sock_connect=connect_seconds, sock_read=read_seconds
        )
        self._options = {"timeout": timeout, "json_serialize": strict_json, **session_options}
        self._session: aiohttp.ClientSession | None = None

    def get(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._limit, limit_per_host=0, resolver=self._resolver)
            self._session = aiohttp.ClientSession(connector=connector, **self._options)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def strict_json(value: Any) -> str:
    """The JSON every upstream body is written as: compact, non-ASCII kept, and a non-finite float raises
    ValueError instead of becoming `NaN` or `Infinity`, which are not JSON and which strict upstreams refuse."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
