"""What every quota limiter shares: its config, the slot it yields, the one `QuotaLimiter` protocol, and the
verdicts of one attempt at the quota. Standard library only: no Redis, no metrics."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Literal, Protocol

Reason = Literal["rate", "concurrency", "tokens", "queue"]


@dataclass(frozen=True)
class QuotaConfig:
    """One upstream account's quota and how long a caller may wait for it."""

    requests_per_second: float = 20.0
    max_concurrent: int = 5
    tokens_per_minute: int | None = None
    max_wait_seconds: float = 5.0  # how long acquire() may wait for a slot before giving up
    lease_seconds: float = 120.0  # a concurrency slot held by a crashed replica frees itself after this
    # Spacing added per second of quota: the upstream counts arrivals, and calls admitted 1/rps apart can
    # arrive closer together (event loop, pool, network). 0.05 costs 5 % of the rate when the rate binds.
    rate_margin_seconds: float = 0.05

    def __post_init__(self) -> None:
        if self.requests_per_second <= 0 or self.max_concurrent < 1 or self.lease_seconds <= 0:
            raise ValueError("requests_per_second, max_concurrent and lease_seconds must be positive")
        if self.tokens_per_minute is not None and self.tokens_per_minute < 1:
            raise ValueError(f"tokens_per_minute must be positive or None, got {self.tokens_per_minute}")
        if self.max_wait_seconds < 0 or self.rate_margin_seconds < 0:
            raise ValueError("max_wait_seconds and rate_margin_seconds must be >= 0")

    @property
    def interval_us(self) -> int:
        """Microseconds between two admissions; the extra one keeps rps + 1 calls out of any closed window."""
        return int((1_000_000 + round(self.rate_margin_seconds * 1_000_000)) // self.requests_per_second) + 1


@dataclass(frozen=True)
class Grant:
    """An attempt that got in."""

    admitted_at: float  # seconds on the admitting clock
    lease: str | None = None  # the Redis lease; None when admitted in process


@dataclass(frozen=True)
class Denial:
    """An attempt that took nothing, and why."""

    reason: Reason
    wait_seconds: float  # known lower bound before a retry can succeed (0: unknown, a slot must free)
    reserved_tokens: int = 0


class Slot:
    """One admitted call, yielded by `async with limiter.slot(estimate) as slot:`."""

    def __init__(
        self,
        estimated_tokens: int,
        reserved_tokens: int,
        grant: Grant,
        waited_seconds: float,
        pace: Callable[[], Awaitable[None]],
    ) -> None:
        self.estimated_tokens = estimated_tokens
        self.reserved_tokens = reserved_tokens  # the estimate, capped at one minute's budget
        self.admitted_at = grant.admitted_at  # seconds on the admitting clock: Redis TIME, else local monotonic
        self.shared = grant.lease is not None  # False: admitted in process (local limiter or Redis fallback)
        self.waited_seconds = waited_seconds
        self.actual_tokens: int | None = None
        self._pace = pace

    def settle(self, actual_tokens: int) -> None:
        """Report the real usage; the difference to the reservation is given back or charged on exit."""
        if actual_tokens < 0:
            raise ValueError(f"actual_tokens must be >= 0, got {actual_tokens}")
        self.actual_tokens = actual_tokens

    async def pace(self) -> None:
        """Before another attempt at the upstream inside this slot: wait for the rate alone (the slot and the
        tokens are held already); `OverloadedError` when that is more than `max_wait_seconds` away."""
        await self._pace()

    @property
    def token_correction(self) -> int:
        """Tokens to charge (positive) or give back (negative) when the slot is released."""
        return 0 if self.actual_tokens is None else self.actual_tokens - self.reserved_tokens


class QuotaLimiter(Protocol):
    """An upstream account's quota: a slot per upstream call (`LocalQuotaLimiter`, `RedisQuotaLimiter`)."""

    def slot(self, estimated_tokens: int = 0) -> AbstractAsyncContextManager[Slot]: ...

    async def aclose(self) -> None: ...
