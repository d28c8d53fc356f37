"""The key of the gRPC call being served (set by the interceptor in the call's own task), for the servicer."""

from __future__ import annotations

from contextvars import ContextVar

from gateway.keys.model import ApiKey

CURRENT_KEY: ContextVar[ApiKey | None] = ContextVar("current_api_key", default=None)
