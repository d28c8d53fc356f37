"""The client's say over the caches: `Cache-Control: no-cache` asks for a fresh answer."""

from __future__ import annotations

from fastapi import Request


def cache_allowed(request: Request) -> bool:
    """False when any Cache-Control header carries the `no-cache` directive (directives are case-insensitive,
    comma-separated, and may carry arguments: `no-cache="set-cookie"` is still no-cache)."""
    directives = (
        part.split("=", 1)[0].strip().lower()
        for header in request.headers.getlist("cache-control")
        for part in header.split(",")
    )
    return "no-cache" not in directives
