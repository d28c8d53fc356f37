"""`Gatekeeper`: who is calling (401), may they call this route family (403), and are they inside their own
and their team's limits (429), and the task watchers each key holds (`KeyWatchers`), for REST and gRPC alike.

A request whose key and team have no limits costs a hash and a dict lookup; one with limits costs one Redis
script (or the in-process equivalent) that checks them all. Chat calls also reserve their estimated tokens
and a stream slot, settled when the answer's usage is known; these checks run before the call queues for the
account's chat quota, so a team at its own limit never holds one of the account's slots.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from gateway.errors import AuthenticationError, InsufficientQuotaError, PermissionDeniedError, RateLimitExceededError
from gateway.keys import names
from gateway.keys.families import required_scope
from gateway.keys.limiter import Check, KeyLimiter, Refusal
from gateway.keys.model import ApiKey, KeyLimits, TokenBudget
from gateway.keys.resolver import ANONYMOUS, KeyResolver
from gateway.keys.watchers import KeyWatchers

BUDGETED = frozenset({"embeddings", "chat", "video", "search"})  # a spent budget still reads its usage
STREAM_LEASE_US = 600 * 1_000_000  # a crashed replica's stream slot frees itself after this
MAX_ADMISSIONS = 10_000  # built admissions kept (keys x route families)


class ChatReservation:
    """The tokens and stream slot a chat call holds; `settle()` reports what it really used."""

    def __init__(self) -> None:
        self.actual: int | None = None  # None: unknown, the estimate stays charged

    def settle(self, tokens: int) -> None:
        self.actual = max(0, tokens)


@dataclass(frozen=True)
class _Admission:
    """The checks `admit` takes for one key and route family, built once and reused while the key, its team's
    limits and the month (the budget's counter) stay the same: a request builds nothing."""

    key: ApiKey
    team_limits: KeyLimits
    month_ends: float  # epoch seconds
    checks: list[Check]

    def current(self, key: ApiKey, team_limits: KeyLimits, now: float) -> bool:
        return self.key is key and self.team_limits is team_limits and now < self.month_ends


class Gatekeeper:
    def __init__(self, resolver: KeyResolver, limiter: KeyLimiter, watchers: KeyWatchers | None = None) -> None:
        self.resolver = resolver
        self.limiter = limiter
        self.watchers = watchers if watchers is not None else KeyWatchers()  # task watchers held per key
        self._admissions: dict[tuple[str, str], _Admission] = {}

    def authenticate(self, authorization: str | None, family: str) -> ApiKey:
        """The caller's key; 401 when unknown, expired or revoked, 403 when it lacks the family's scope."""
        return self._in_scope(self.resolver.resolve(authorization), family)

    def authenticate_id(self, key_id: str, family: str) -> ApiKey:
        """The key with this id as `authenticate` would find it now (a watch token names the key it was minted
        with): 401 once it is revoked, expired or gone, 403 without the family's scope."""
        if not self.resolver.enabled:
            return ANONYMOUS
        key = self.resolver.key(key_id)
        if key is None:
            raise AuthenticationError("the API key this token was issued with no longer exists")
        if (refusal := key.refusal(time.time())) is not None:
            raise AuthenticationError(refusal)
        return self._in_scope(key, family)

    def _in_scope(self, key: ApiKey, family: str) -> ApiKey:
        scope = required_scope(family)
        if scope is not None and scope not in key.scopes:
            raise PermissionDeniedError(
                f"API key {key.prefix} lacks the scope {scope!r} (it has: {', '.join(sorted(key.scopes)) or 'none'})"
            )
        return key

    async def admit(self, key: ApiKey, family: str) -> None:
        """Requests per minute of the family, and the monthly budget, of the key and its team."""
        now = time.time()
        admission = self._admissions.get((key.id, family))
        if admission is None or not admission.current(key, self.resolver.team_limits(key.team), now):
            admission = self._admission(key, family, now)
        if admission.checks:
            await self._take(admission.checks, key)

    def _admission(self, key: ApiKey, family: str, now: float) -> _Admission:
        checks = []
        for subject, limits in self._subjects(key):
            rpm = limits.rpm_for(family)
            if rpm:
                interval = math.floor(60_000_000 / rpm)
                checks.append(Check("rate", names.limit_key("rpm", subject, family), interval, rpm))
            if limits.monthly_budget is not None and family in BUDGETED:
                checks.append(_budget_check(subject, limits.monthly_budget, now))
        if len(self._admissions) >= MAX_ADMISSIONS:  # revoked keys' entries go too; the others are rebuilt
            self._admissions.clear()
        admission = _Admission(key, self.resolver.team_limits(key.team), now + names.seconds_to_next_month(now), checks)
        self._admissions[(key.id, family)] = admission
        return admission

    @asynccontextmanager
    async def chat(self, key: ApiKey, estimated_tokens: int) -> AsyncIterator[ChatReservation]:
        """Chat tokens per minute (the estimate reserved, settled on exit) and a concurrent stream slot."""
        checks: list[Check] = []
        reservation = ChatReservation()
        lease = uuid.uuid4().hex
        for subject, limits in self._subjects(key):
            if limits.chat_tokens_per_minute:
                reserve = min(estimated_tokens, limits.chat_tokens_per_minute)  # more could never be had
                key_name = names.limit_key("tpm", subject)
                checks.append(Check("tokens", key_name, limits.chat_tokens_per_minute, reserve))
            if limits.concurrent_chat_streams:
                key_name = names.limit_key("streams", subject)
                checks.append(Check("slots", key_name, limits.concurrent_chat_streams, lease, STREAM_LEASE_US))
        if not checks:
            yield reservation
            return
        await self._take(checks, key)
        try:
            yield reservation
        finally:
            await self.limiter.release(checks, reservation.actual)

    async def count_video(self, key: ApiKey) -> None:
        """One more video today for the key and its team, or 429 when that is over `videos_per_day`."""
        now = time.time()
        ttl_ms = math.ceil(names.seconds_to_next_day(now) * 1000)
        checks = [
            Check("count", names.limit_key("videos", subject, names.day_of(now)), limits.videos_per_day, 1, ttl_ms)
            for subject, limits in self._subjects(key)
            if limits.videos_per_day
        ]
        if checks:
            await self._take(checks, key)

    def _subjects(self, key: ApiKey) -> list[tuple[str, KeyLimits]]:
        return [
            (names.key_subject(key.id), key.limits),
            (names.team_subject(key.team), self.resolver.team_limits(key.team)),
        ]

    async def _take(self, checks: list[Check], key: ApiKey) -> None:
        refusal = await self.limiter.admit(checks)
        if refusal is not None:
            raise _error(refusal, key)


def _budget_check(subject: str, budget: float | TokenBudget, now: float) -> Check:
    wait_us = math.ceil(names.seconds_to_next_month(now) * 1_000_000)
    spent = names.spend_key(names.month_of(now), subject)
    if isinstance(budget, TokenBudget):
        return Check("budget", spent, budget.tokens, "tokens", wait_us)
    return Check("budget", spent, budget, "cost", wait_us)


_LIMIT_NAMES = {
    "rate": "requests per minute",
    "tokens": "chat tokens per minute",
    "slots": "concurrent chat streams",
    "count": "videos per day",
}


def _error(refusal: Refusal, key: ApiKey) -> RateLimitExceededError | InsufficientQuotaError:
    check = refusal.check
    whose = f"team {key.team!r}" if ":team:" in check.key else f"API key {key.prefix}"
    retry_after = max(1, math.ceil(refusal.wait_seconds))
    if check.kind == "budget":  # its wait was reckoned when the check was built: from now instead
        retry_after = max(1, math.ceil(names.seconds_to_next_month(time.time())))
        unit = "tokens" if check.b == "tokens" else "in cost"
        return InsufficientQuotaError(
            f"the monthly budget of {check.a:g} {unit} of {whose} is spent; it renews at the start of next month (UTC)",
            retry_after=retry_after,
        )
    return RateLimitExceededError(
        f"{whose} is over its limit of {_LIMIT_NAMES[check.kind]}; retry in {retry_after} s", retry_after=retry_after
    )
