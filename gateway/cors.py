"""Browser pages of other origins (GATEWAY_CORS_ALLOW_ORIGINS): what their cross-origin calls may send and read.

Starlette's `CORSMiddleware` answers the preflights and adds the headers; the WebSocket routes check the Origin of
a handshake themselves (`gateway.routes.socket_handshake`), since CORS does not apply to WebSockets. No credentials
mode: the API takes bearer keys and watch tokens, never cookies, so a page cannot borrow a user's session.
"""

from __future__ import annotations

from typing import Any

# What a page sends: its key (or its back end's), JSON, an idempotency key, a resume point, a request id.
ALLOWED_HEADERS = ["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID", "Cache-Control", "X-Request-Id"]
# What a page may read of an answer besides the CORS-safelisted headers.
EXPOSED_HEADERS = ["Location", "Retry-After", "X-Request-Id", "X-Request-Cost", "X-Cache", "Idempotent-Replayed"]
PREFLIGHT_CACHE_SECONDS = 600


def cors_options(origins: list[str]) -> dict[str, Any]:
    """`CORSMiddleware`'s options for `origins` (`*`: any)."""
    return {
        "allow_origins": origins,
        "allow_methods": ["GET", "POST", "PUT", "DELETE"],
        "allow_headers": ALLOWED_HEADERS,
        "expose_headers": EXPOSED_HEADERS,
        "allow_credentials": False,
        "max_age": PREFLIGHT_CACHE_SECONDS,
    }
