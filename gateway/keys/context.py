"""The key of the request being served, set by the transport (REST's key middleware, gRPC's interceptor) in the
request's own task: the billed services record usage with it, the routes read it."""

from __future__ import annotations

from contextvars import ContextVar

from gateway.keys.model import ApiKey
from gateway.keys.resolver import ANONYMOUS

CURRENT_KEY: ContextVar[ApiKey | None] = ContextVar("current_api_key", default=None)


def current_key() -> ApiKey:
    """The caller's key (ANONYMOUS while no keys are configured, or outside a request)."""
    return CURRENT_KEY.get() or ANONYMOUS
