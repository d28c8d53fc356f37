"""The chat upstream's hosts: `CHAT_BASE_URL` and then `CHAT_BACKUP_BASE_URLS`, in order of preference.

Each host has its own connection pool, made once for the process, and its own circuit breaker: a host that
keeps failing (unreachable, 5xx, a stream that breaks before its first chunk) is skipped until its probe, so
requests go straight to the next host rather than each waiting out a dead one. The account's quota is not
here: it belongs to the key, which every host shares.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway import metrics
from gateway.settings import ChatSettings
from gateway.upstreams.breaker import BreakerState, CircuitBreaker
from gateway.upstreams.pool import PooledSession


@dataclass(frozen=True)
class ChatHost:
    """One configured base URL; `name` (host[:port]) labels its metrics."""

    name: str
    chat_url: str
    models_url: str
    pool: PooledSession
    breaker: CircuitBreaker


def host_name(base_url: str) -> str:
    """The metric label of a configured base URL: its host and explicit port, never its user info or path."""
    parts = urlsplit(base_url)
    host = parts.hostname or "unknown"
    return f"{host}:{parts.port}" if parts.port else host


class ChatHosts:
    """The hosts in order of preference; `aclose` closes every pool."""

    def __init__(self, settings: ChatSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._hosts = [_host(url, settings, clock) for url in settings.base_urls()]
        # With one host there is nowhere else to go: the models' breakers already fail fast.
        self._skipping = len(self._hosts) > 1

    def __iter__(self) -> Iterator[ChatHost]:
        return iter(self._hosts)

    def allowed(self) -> Iterator[ChatHost]:
        """The hosts a call may try now, in order. Lazy: a host's breaker is asked only when the host before
        it has failed, so a half-open host's single probe is not taken by a call that never goes there."""
        return (host for host in self._hosts if not self._skipping or host.breaker.allow())

    def failed(self, host: ChatHost) -> None:
        """The host could not be reached, answered 5xx, or its stream broke or stalled before the first chunk."""
        if self._skipping:
            host.breaker.record_failure()

    def answered(self, host: ChatHost) -> None:
        """The host answered (a success, or an error that is the request's or the account's, not the host's)."""
        if self._skipping:
            host.breaker.record_success()

    def released(self, host: ChatHost) -> None:
        """The call ended with no verdict on the host (the caller went away)."""
        if self._skipping:
            host.breaker.release()

    def preferred(self) -> ChatHost:
        """The first host whose breaker is closed (else the primary), for calls that are not worth a probe."""
        return next((h for h in self._hosts if h.breaker.state is BreakerState.CLOSED), self._hosts[0])

    def retry_after_seconds(self) -> int:
        """Whole seconds until the first open host may be probed again (at least 1)."""
        return max(1, math.ceil(min(host.breaker.retry_after() for host in self._hosts)))

    async def aclose(self) -> None:
        for host in self._hosts:
            await host.pool.aclose()


def _host(base_url: str, settings: ChatSettings, clock: Callable[[], float]) -> ChatHost:
    name = host_name(base_url)
    pool = PooledSession(
        max_connections=settings.max_connections,
        connect_seconds=settings.connect_timeout_seconds,
        read_seconds=settings.first_byte_timeout_seconds,  # the headers, then the idle time between chunks
        read_bufsize=2**20,  # the read buffer (reading pauses above it); chat.MAX_LINE_BYTES bounds one SSE line
    )
    breaker = CircuitBreaker(
        name, settings.breaker_failures, settings.breaker_reset_seconds, clock, gauge=metrics.HOST_BREAKER_STATE
    )
    return ChatHost(name, f"{base_url}/chat/completions", f"{base_url}/models", pool, breaker)
