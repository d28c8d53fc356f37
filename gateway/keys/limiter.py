"""The per-key and per-team limits as checks taken all together or not at all, in Redis (every replica) or in
this process: `RedisKeyLimiter` runs `lua/admit.lua` after the account quota's `prelude.lua` (the same GCRA and
token bucket arithmetic), `LocalKeyLimiter` runs the same rules in process memory. A requests-per-minute limit of
N is a GCRA with a burst of N: N requests back to back from idle, then one every 60/N s (the account quota keeps
a burst of one). A refused request is not queued: it gets 429 at once with the wait the check returned, the time
until it would be admitted.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from importlib.resources import files
from typing import Any, Protocol

from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from gateway.keys.checks import Check, CheckKind, Refusal, burst
from gateway.keys.leases import RateLeases, leasable
from gateway.keys.redis_channel import PipelinedChannel
from gateway.keys.spend_cache import SpendCache
from gateway.redis_client import OUTAGES, REDIS_FAILURES, RedisConnection

log = logging.getLogger(__name__)

__all__ = ["Check", "CheckKind", "KeyLimiter", "LocalKeyLimiter", "RedisKeyLimiter", "Refusal"]


class KeyLimiter(Protocol):
    async def admit(self, checks: list[Check]) -> Refusal | None: ...

    async def release(self, checks: list[Check], actual_tokens: int | None) -> None:
        """Free the slots; settle each token reservation with the tokens used (None: unknown, keep it)."""

    async def add_spend(self, keys: list[str], cost: float, tokens: int) -> None: ...

    async def aclose(self) -> None: ...


class LocalKeyLimiter:
    """The checks in this process alone (no Redis): right for one replica. `clock` gives monotonic microseconds
    (tests pass their own)."""

    def __init__(self, clock: Callable[[], int] | None = None) -> None:
        self._now = clock or _now_us
        self._tat: dict[str, int] = {}
        self._buckets: dict[str, tuple[float, int]] = {}
        self._slots: dict[str, set[str]] = {}
        self._counts: dict[str, tuple[int, int]] = {}  # key -> (count, expires at µs)
        self._spend: dict[str, dict[str, float]] = {}

    async def admit(self, checks: list[Check]) -> Refusal | None:
        now = self._now()
        for check in checks:
            wait = self._wait(check, now)
            if wait > 0:
                return Refusal(check, wait / 1e6)
        for check in checks:
            self._take(check, now)
        return None

    async def release(self, checks: list[Check], actual_tokens: int | None) -> None:
        now = self._now()
        for check in checks:
            if check.kind == "tokens":
                capacity = int(check.a)
                level = min(capacity, self._level(check.key, capacity, now) - correction(check, actual_tokens))
                self._buckets[check.key] = (level, now)
            elif check.kind == "slots":
                self._slots.get(check.key, set()).discard(str(check.b))

    async def add_spend(self, keys: list[str], cost: float, tokens: int) -> None:
        for key in keys:
            spent = self._spend.setdefault(key, {"cost": 0.0, "tokens": 0.0})
            spent["cost"] += cost
            spent["tokens"] += tokens

    async def aclose(self) -> None:
        """Nothing to close in process."""

    def _wait(self, check: Check, now: int) -> float:
        if check.kind == "rate":  # the GCRA of admit.lua: the TAT may run (burst - 1) intervals ahead of now
            return self._tat.get(check.key, 0) - now - (burst(check) - 1) * int(check.a)
        if check.kind == "tokens":
            capacity = int(check.a)
            return math.ceil((float(check.b) - self._level(check.key, capacity, now)) * 60_000_000 / capacity)
        if check.kind == "slots":
            return 1_000_000 if len(self._slots.get(check.key, ())) >= int(check.a) else 0
        if check.kind == "count":
            count, expires = self._counts.get(check.key, (0, 0))
            count = count if expires > now else 0
            return check.c * 1000 if count + int(check.b) > int(check.a) else 0
        spent = self._spend.get(check.key, {}).get(str(check.b), 0.0)
        return check.c if spent >= float(check.a) else 0

    def _take(self, check: Check, now: int) -> None:
        if check.kind == "rate":
            self._tat[check.key] = max(self._tat.get(check.key, 0), now) + int(check.a)
        elif check.kind == "tokens":
            self._buckets[check.key] = (self._level(check.key, int(check.a), now) - float(check.b), now)
        elif check.kind == "slots":
            self._slots.setdefault(check.key, set()).add(str(check.b))
        elif check.kind == "count":
            count, expires = self._counts.get(check.key, (0, 0))
            count = count if expires > now else 0
            self._counts[check.key] = (count + int(check.b), now + check.c * 1000)

    def _level(self, key: str, capacity: int, now: int) -> float:
        level, at = self._buckets.get(key, (float(capacity), now))
        return min(float(capacity), level + (now - at) * capacity / 60_000_000)


def _lua(name: str) -> str:
    prelude = files("gateway.quota").joinpath("lua").joinpath("prelude.lua").read_text(encoding="utf-8")
    return prelude + "\n" + files("gateway.keys").joinpath("lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")


class RedisKeyLimiter:
    """The checks on Redis' clock, shared by every replica. While Redis fails, each replica limits alone
    (`LocalKeyLimiter`), logged once per outage: a dead Redis must not fail requests. Calls go through the
    circuit of `redis` (the process's shared `RedisConnection`, or a URL for one of its own): while it is open
    the checks are local at once, so a frozen Redis slows only the requests already waiting on it.

    Most requests wait for no Redis call: requests-per-minute limits large enough are taken from leased tokens
    (`RateLeases`) and budgets from a copy of the spend (`SpendCache`); the other checks (small rate limits,
    chat tokens and streams, videos) and those two when they cannot decide are one script call."""

    def __init__(self, redis: str | RedisConnection, timeout_seconds: float = 0.25, backoff_seconds: float = 1.0):
        self._redis = RedisConnection.shared(redis, timeout_seconds=timeout_seconds, backoff_seconds=backoff_seconds)
        self._admit = self._redis.client.register_script(_lua("admit"))
        self._release = self._redis.client.register_script(_lua("release"))
        self._lease = self._redis.client.register_script(_lua("lease"))
        self._channel = PipelinedChannel(self._redis.client)
        self._leases = RateLeases(self._leased)
        self._spend = SpendCache(self._spent)
        self._fallback = LocalKeyLimiter()
        self._degraded = False

    def __repr__(self) -> str:
        return "RedisKeyLimiter()"  # no URL: it may hold a password

    async def admit(self, checks: list[Check]) -> Refusal | None:
        exact: list[Check] = []
        taken: list[Check] = []  # leased tokens, given back if another check refuses
        refusal: Refusal | None = None
        for check in checks:
            verdict: bool | Refusal | None = None
            if check.kind == "budget":
                verdict = self._spend.verdict(check)
            elif leasable(check):
                verdict = await self._leases.take(check)
                if verdict is True:
                    taken.append(check)
            if verdict is None:
                exact.append(check)
            elif isinstance(verdict, Refusal):
                refusal = verdict
                break
        if refusal is None and exact:
            refusal = await self._admit_exactly(exact)
        if refusal is not None:
            for check in taken:
                self._leases.give_back(check)
        return refusal

    async def _admit_exactly(self, checks: list[Check]) -> Refusal | None:
        args: list[str | int | float] = []
        for check in checks:
            args += [check.kind, check.a, check.b, check.c]
        try:
            reply: Any = await self._redis.call(lambda: self._evalsha(self._admit, [c.key for c in checks], args))
        except REDIS_FAILURES as exc:
            self._fall_back(exc)
            return await self._fallback.admit(checks)
        self._recovered()
        if int(reply[0]) == 1:
            return None
        return Refusal(checks[int(reply[2]) - 1], int(reply[1]) / 1e6)

    async def release(self, checks: list[Check], actual_tokens: int | None) -> None:
        entries = [c for c in checks if c.kind in ("tokens", "slots")]
        if not entries:
            return
        args: list[str | int | float] = []
        for check in entries:
            args += [check.kind, check.a if check.kind == "tokens" else check.b, correction(check, actual_tokens)]
        try:
            await self._redis.call(lambda: self._evalsha(self._release, [c.key for c in entries], args))
        except REDIS_FAILURES as exc:  # the slot's lease frees it; the bucket refills on its own
            self._fall_back(exc)
            await self._fallback.release(checks, actual_tokens)

    async def add_spend(self, keys: list[str], cost: float, tokens: int) -> None:
        """Spend is added by the usage store's record script in Redis (once per request id); this replica's copy
        of it grows at once."""
        self._spend.add(keys, cost, tokens)

    async def _leased(self, check: Check, wanted: int) -> tuple[int, int]:
        args: list[str | int | float] = [check.a, wanted, burst(check)]
        reply: Any = await self._redis.call(lambda: self._evalsha(self._lease, [check.key], args))
        return int(reply[0]), int(reply[1])

    async def _spent(self, key: str) -> tuple[float, float]:
        reply: Any = await self._redis.call(lambda: self._channel.execute("HMGET", key, "cost", "tokens"))
        return float(reply[0] or 0), float(reply[1] or 0)

    async def _evalsha(self, script: AsyncScript, keys: list[str], args: list[str | int | float]) -> Any:
        """The script by its SHA on the pipelined channel (the limits are checked on every request); a Redis that
        lost its script cache (a restart) gets it loaded again."""
        try:
            return await self._channel.execute("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            await self._redis.client.script_load(script.script)
            return await self._channel.execute("EVALSHA", script.sha, len(keys), *keys, *args)

    async def aclose(self) -> None:
        await self._leases.aclose()
        await self._spend.aclose()
        await self._channel.aclose()
        await self._redis.aclose()

    def _fall_back(self, exc: BaseException) -> None:
        """Logged at DEBUG: the Redis circuit logs the outage once for every user."""
        if isinstance(exc, OUTAGES):  # a call that timed out may have left its connection hanging
            self._channel.reset()
        if not self._degraded:
            self._degraded = True
            log.debug("key limits: Redis unreachable (%s); limiting this replica alone", type(exc).__name__)

    def _recovered(self) -> None:
        if self._degraded:
            self._degraded = False
            log.debug("key limits: Redis answers again; limits are shared across replicas")


def correction(check: Check, actual_tokens: int | None) -> int:
    """Tokens to charge (positive) or give back (negative) to a token check's bucket once the call is over."""
    return 0 if actual_tokens is None or check.kind != "tokens" else actual_tokens - int(check.b)


def _now_us() -> int:
    return time.monotonic_ns() // 1000
