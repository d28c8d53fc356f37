"""Keeps calls to a third-party API inside the account's quota: requests/second, concurrent calls, tokens/minute.

The quota belongs to the upstream account, not to a pod, so `RedisQuotaLimiter` keeps the state in Redis and
every replica runs the same atomic Lua scripts against it, on Redis' clock. `LocalQuotaLimiter` runs the same
arithmetic in process: for a single replica, for tests, and as the fallback while Redis is unreachable (a dead
Redis must not fail requests; each replica then limits itself alone).

The three limits, all checked and taken together or not at all (times in integer microseconds):

- rate: GCRA with a burst of one. A call is admitted when now >= TAT (theoretical arrival time) and TAT becomes
  now + interval, with interval = floor((1 s + margin) / rps) + 1 µs. So any rps + 1 admissions span more than
  1 s + margin, and no 1-second window at the upstream holds more than rps calls (integer rps) whatever its
  windowing, as long as no call travels `rate_margin_seconds` longer than another from admission to upstream.
  A burst is spread out: (position in queue) * interval of added latency.
- concurrency: a lease per call (Redis: a sorted set scored by expiry, renewed while held), so a crashed
  replica's slot frees itself after `lease_seconds` while a slow call keeps its own.
- tokens: a bucket of `tokens_per_minute` refilled continuously; the estimate is taken on entry and the
  difference to `Slot.settle()` is given back or charged when the block exits (the balance may go negative).

A call that tries the upstream again inside its slot (a retry after a 429 or a 5xx) is one more arrival
there: `Slot.pace()` waits for the rate alone before it (the slot and the tokens are already held).

Waiting: callers of one process queue FIFO and only the head asks the limiter, so N waiters cost one Redis
call per wait, not N. The head sleeps exactly the wait the algorithm returns (rate, tokens); a full
concurrency limit is rechecked when this process frees a slot or after `poll_seconds` (another replica's).
A wait longer than what is left of `max_wait_seconds` fails at once with `OverloadedError` and Retry-After.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Protocol, Self

from gateway import metrics
from gateway.errors import OverloadedError
from gateway.redis_client import REDIS_FAILURES, redis_client

log = logging.getLogger(__name__)

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


class Slot:
    """One admitted call, yielded by `async with limiter.slot(estimate) as slot:`."""

    def __init__(
        self,
        estimated_tokens: int,
        reserved_tokens: int,
        grant: _Grant,
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
    def slot(self, estimated_tokens: int = 0) -> AbstractAsyncContextManager[Slot]: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class _Grant:
    admitted_at: float  # seconds on the admitting clock
    lease: str | None = None  # the Redis lease; None when admitted in process


@dataclass(frozen=True)
class _Denial:
    reason: Reason
    wait_seconds: float  # known lower bound before a retry can succeed (0: unknown, a slot must free)
    reserved_tokens: int = 0


class _LocalQuota:
    """The three algorithms in process memory, with the same arithmetic as the Lua scripts below."""

    def __init__(self, config: QuotaConfig) -> None:
        self.config = config
        self._held = 0
        self._tat = 0
        self._capacity = config.tokens_per_minute or 0
        self._level = float(self._capacity)
        self._level_at = _monotonic_us()

    def try_take(self, reserved: int) -> _Grant | _Denial:
        now = _monotonic_us()
        level = self._refilled(now)
        wait: int = self._tat - now
        reason: Reason = "rate"
        shortfall = math.ceil((reserved - level) * 60_000_000 / self._capacity) if self._capacity else 0
        if shortfall > wait:
            wait, reason = shortfall, "tokens"
        if self._held >= self.config.max_concurrent:
            return _Denial("concurrency", max(wait, 0) / 1e6, reserved)
        if wait > 0:
            return _Denial(reason, wait / 1e6, reserved)
        self._tat = now + self.config.interval_us
        self._held += 1
        self._level, self._level_at = level - reserved, now
        return _Grant(admitted_at=now / 1e6)

    def try_pace(self) -> _Grant | _Denial:
        """The rate alone, for another attempt of a call that holds its slot and tokens."""
        now = _monotonic_us()
        if self._tat > now:
            return _Denial("rate", (self._tat - now) / 1e6)
        self._tat = now + self.config.interval_us
        return _Grant(admitted_at=now / 1e6)

    def give_back(self, token_correction: int) -> None:
        self._held -= 1
        if self._capacity and token_correction:
            now = _monotonic_us()
            self._level, self._level_at = min(self._capacity, self._refilled(now) - token_correction), now

    def _refilled(self, now: int) -> float:
        return min(self._capacity, self._level + (now - self._level_at) * self._capacity / 60_000_000)


class _Wakeup:
    """Wakes the head of the queue as soon as this process frees a slot (a ticket taken before asking
    the limiter cannot miss a release that happens while the answer is on its way)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def ticket(self) -> asyncio.Event:
        return self._event

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, ticket: asyncio.Event, timeout: float) -> None:
        with suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await ticket.wait()


class _WaitingLimiter:
    """`slot()` and the FIFO waiting loop; subclasses say how to try once and how to release."""

    def __init__(self, config: QuotaConfig, name: str, poll_seconds: float) -> None:
        self.config = config
        self.name = name
        self._poll_seconds = poll_seconds
        self._queue = asyncio.Lock()  # FIFO: only the head of the queue asks the limiter
        self._wakeup = _Wakeup()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    @asynccontextmanager
    async def slot(self, estimated_tokens: int = 0) -> AsyncIterator[Slot]:
        """Wait for a request, a concurrency slot and the estimated tokens; release the slot on exit."""
        reserved = self._reservation(estimated_tokens)
        started = time.monotonic()
        grant = await self._admit(reserved, started + self.config.max_wait_seconds)
        slot = Slot(estimated_tokens, reserved, grant, time.monotonic() - started, self._pace)
        metrics.QUOTA_WAIT.labels(limiter=self.name).observe(slot.waited_seconds)
        try:
            yield slot
        finally:
            await self._release(grant, slot.token_correction)

    async def aclose(self) -> None:
        """Nothing to close in process; `RedisQuotaLimiter` closes its client."""

    async def _attempt(self, reserved: int) -> _Grant | _Denial:
        raise NotImplementedError

    async def _attempt_pace(self) -> _Grant | _Denial:
        raise NotImplementedError

    async def _release(self, grant: _Grant, token_correction: int) -> None:
        raise NotImplementedError

    async def _pace(self) -> None:
        """Wait for the rate alone (`Slot.pace`). Not through the FIFO queue: its head may be waiting for the
        very slot this caller holds."""
        deadline = time.monotonic() + self.config.max_wait_seconds
        while not isinstance(verdict := await self._attempt_pace(), _Grant):
            if verdict.wait_seconds > deadline - time.monotonic():
                raise self._refusal(verdict)
            await asyncio.sleep(verdict.wait_seconds)

    def _reservation(self, estimated_tokens: int) -> int:
        if estimated_tokens < 0:
            raise ValueError(f"estimated_tokens must be >= 0, got {estimated_tokens}")
        return min(estimated_tokens, self.config.tokens_per_minute or 0)

    async def _admit(self, reserved: int, deadline: float) -> _Grant:
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await self._queue.acquire()
        except TimeoutError:
            raise self._refusal(_Denial("queue", 0.0, reserved)) from None
        try:
            return await self._wait_for_grant(reserved, deadline)
        finally:
            self._queue.release()

    async def _wait_for_grant(self, reserved: int, deadline: float) -> _Grant:
        while True:
            ticket = self._wakeup.ticket()
            verdict = await self._attempt(reserved)
            if isinstance(verdict, _Grant):
                return verdict
            remaining = deadline - time.monotonic()
            if remaining <= 0 or verdict.wait_seconds > remaining:
                raise self._refusal(verdict)  # fail now rather than sleep into a certain refusal
            if verdict.reason == "concurrency":
                await self._wakeup.wait(ticket, min(max(verdict.wait_seconds, self._poll_seconds), remaining))
            else:
                await asyncio.sleep(verdict.wait_seconds)

    def _refusal(self, denial: _Denial) -> OverloadedError:
        config, wait = self.config, denial.wait_seconds
        limit = f"{config.max_wait_seconds:g} s allowed"
        details = {
            "rate": f"{config.requests_per_second:g} requests/s in use, next slot in {wait:.2f} s > {limit}",
            "concurrency": f"all {config.max_concurrent} concurrent calls busy, waited {config.max_wait_seconds:g} s",
            "tokens": f"{denial.reserved_tokens} tokens needed, {config.tokens_per_minute} tokens/minute in use, "
            f"enough in {wait:.1f} s > {limit}",
            "queue": f"still queued behind earlier calls after {config.max_wait_seconds:g} s",
        }
        message = f"{self.name} quota exhausted: {details[denial.reason]}; retry later"
        metrics.QUOTA_REFUSALS.labels(limiter=self.name, reason=denial.reason).inc()
        return OverloadedError(message, retry_after=max(1, math.ceil(wait)))


class LocalQuotaLimiter(_WaitingLimiter):
    """The quota for this process alone: right for one replica, N times the quota for N replicas."""

    def __init__(self, config: QuotaConfig | None = None, *, name: str = "upstream") -> None:
        # Every release in process wakes the head of the queue, so a full limit needs no polling.
        super().__init__(config or QuotaConfig(), name, poll_seconds=math.inf)
        self._quota = _LocalQuota(self.config)

    async def _attempt(self, reserved: int) -> _Grant | _Denial:
        return self._quota.try_take(reserved)

    async def _attempt_pace(self) -> _Grant | _Denial:
        return self._quota.try_pace()

    async def _release(self, grant: _Grant, token_correction: int) -> None:
        self._quota.give_back(token_correction)
        self._wakeup.notify()


class RedisQuotaLimiter(_WaitingLimiter):
    """The quota shared by every replica through Redis, on Redis' clock; the local one while Redis is down.

    Keys share the hash tag `{name}` by default so the scripts also run on a Redis Cluster. Redis failures
    never fail a request: the call is limited in process instead, logged once per outage, and Redis is
    asked again after `backoff_seconds`. The URL may hold a password: it is never logged.
    """

    def __init__(
        self,
        url: str,
        config: QuotaConfig | None = None,
        *,
        name: str = "upstream",
        key_prefix: str | None = None,
        timeout_seconds: float = 0.25,
        backoff_seconds: float = 1.0,
        poll_seconds: float = 0.05,
    ) -> None:
        super().__init__(config or QuotaConfig(), name, poll_seconds)
        prefix = key_prefix if key_prefix is not None else f"quota:{{{name}}}:"
        self._rate_key, self._slots_key, self._tokens_key = (prefix + "rate", prefix + "slots", prefix + "tokens")
        self._client = redis_client(url, timeout_seconds)
        self._acquire = self._client.register_script(_ACQUIRE_LUA)
        self._release_script = self._client.register_script(_RELEASE_LUA)
        self._pace_script = self._client.register_script(_PACE_LUA)
        self._renew = self._client.register_script(_RENEW_LUA)
        self._fallback = _LocalQuota(self.config)
        self._backoff_seconds = backoff_seconds
        self._retry_at = -math.inf  # monotonic; before it Redis is not asked
        self._degraded = False
        self._renewals: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._retries: set[asyncio.Task[None]] = set()  # give-backs Redis failed, tried again after the back-off

    def __repr__(self) -> str:
        return f"RedisQuotaLimiter(name={self.name!r}, config={self.config!r})"  # no URL: it may hold a password

    @property
    def degraded(self) -> bool:
        """True while Redis is unreachable and this replica limits itself alone."""
        return self._degraded

    async def aclose(self) -> None:
        for task in (*self._renewals.values(), *self._retries):
            task.cancel()
        await asyncio.gather(*self._renewals.values(), *self._retries, *self._tasks, return_exceptions=True)
        await self._client.aclose()

    async def _attempt(self, reserved: int) -> _Grant | _Denial:
        if time.monotonic() < self._retry_at:
            return self._granted_alone(reserved)
        lease = uuid.uuid4().hex
        try:
            reply = await self._acquire(keys=self._keys(), args=self._acquire_args(lease, reserved))
        except asyncio.CancelledError:
            self._forget(lease, reserved)  # the script may have run: free what it took
            raise
        except REDIS_FAILURES as exc:
            self._fall_back(exc)
            self._forget(lease, reserved)
            return self._granted_alone(reserved)
        self._recovered()
        return self._verdict(reply, lease, reserved)

    async def _attempt_pace(self) -> _Grant | _Denial:
        if time.monotonic() < self._retry_at:
            return self._fallback.try_pace()
        try:
            reply = await self._pace_script(keys=[self._rate_key], args=[self.config.interval_us])
        except REDIS_FAILURES as exc:
            self._fall_back(exc)
            return self._fallback.try_pace()
        self._recovered()
        if int(reply[0]) == 1:
            return _Grant(admitted_at=int(reply[1]) / 1e6)
        return _Denial("rate", int(reply[1]) / 1e6)

    async def _release(self, grant: _Grant, token_correction: int) -> None:
        if grant.lease is None:
            self._fallback.give_back(token_correction)
            self._wakeup.notify()
            return
        renewal = self._renewals.pop(grant.lease, None)
        if renewal is not None:
            renewal.cancel()
        # Shielded: a second cancellation must not leave the slot taken until its lease runs out.
        await asyncio.shield(self._background(self._give_back(grant.lease, token_correction, only_if_held=False)))

    def _keys(self) -> list[str]:
        return [self._rate_key, self._slots_key, self._tokens_key]

    def _acquire_args(self, lease: str, reserved: int) -> list[str | int]:
        config = self.config
        lease_us = int(config.lease_seconds * 1_000_000)
        return [lease, config.interval_us, config.max_concurrent, lease_us, config.tokens_per_minute or 0, reserved]

    def _verdict(self, reply: list[Any], lease: str, reserved: int) -> _Grant | _Denial:
        if int(reply[0]) == 1:
            self._renewals[lease] = asyncio.ensure_future(self._keep_renewed(lease))
            return _Grant(admitted_at=int(reply[1]) / 1e6, lease=lease)
        return _Denial(_REASONS[bytes(reply[2])], int(reply[1]) / 1e6, reserved)

    def _forget(self, lease: str, reserved: int) -> None:
        """Give back a lease whose acquisition went unanswered (a no-op unless the script ran)."""
        self._background(self._give_back(lease, -reserved, only_if_held=True))

    async def _give_back(self, lease: str, token_correction: int, *, only_if_held: bool) -> None:
        """Free the lease's slot and correct its tokens. When Redis fails, it is tried again after each
        back-off in the background (a blip must not hold the slot until the lease runs out); the caller
        does not wait for those tries, and the settled mark keeps the correction to one."""
        if not await self._give_back_once(lease, token_correction, only_if_held):
            retry = asyncio.ensure_future(self._give_back_later(lease, token_correction, only_if_held))
            self._retries.add(retry)
            retry.add_done_callback(self._retries.discard)

    async def _give_back_later(self, lease: str, token_correction: int, only_if_held: bool) -> None:
        give_up_at = time.monotonic() + self.config.lease_seconds  # by then the lease has freed the slot
        while time.monotonic() + self._backoff_seconds < give_up_at:
            await asyncio.sleep(self._backoff_seconds)
            if await self._give_back_once(lease, token_correction, only_if_held):
                return

    async def _give_back_once(self, lease: str, token_correction: int, only_if_held: bool) -> bool:
        args: list[str | int] = [lease, self.config.tokens_per_minute or 0, token_correction, int(only_if_held)]
        try:
            keys = [self._slots_key, self._tokens_key, f"{self._tokens_key}:settled:{lease}"]
            await self._release_script(keys=keys, args=args)
            return True
        except REDIS_FAILURES as exc:
            self._fall_back(exc)
            return False
        finally:
            self._wakeup.notify()

    async def _keep_renewed(self, lease: str) -> None:
        """Extend the lease while the call runs, so only a crashed holder's slot expires."""
        args: list[str | int] = [lease, int(self.config.lease_seconds * 1_000_000)]
        while True:
            await asyncio.sleep(self.config.lease_seconds / 3)
            try:
                if not await self._renew(keys=[self._slots_key], args=args):
                    log.warning("%s quota: lease %s expired while held (Redis restarted?)", self.name, lease)
                    return
            except REDIS_FAILURES:
                continue  # the next renewal may get through; the lease outlives two misses

    def _background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _granted_alone(self, reserved: int) -> _Grant | _Denial:
        verdict = self._fallback.try_take(reserved)
        if isinstance(verdict, _Grant):
            metrics.QUOTA_FALLBACKS.labels(limiter=self.name).inc()
        return verdict

    def _fall_back(self, exc: BaseException) -> None:
        self._retry_at = time.monotonic() + self._backoff_seconds
        if not self._degraded:
            self._degraded = True
            metrics.QUOTA_DEGRADED.labels(limiter=self.name).set(1)
            log.warning(
                "%s quota: Redis unreachable (%s); limiting this replica alone, its Redis slots free themselves "
                "after %g s",
                self.name,
                exc,
                self.config.lease_seconds,
            )

    def _recovered(self) -> None:
        if self._degraded:
            self._degraded = False
            metrics.QUOTA_DEGRADED.labels(limiter=self.name).set(0)
            log.warning("%s quota: Redis answers again; the quota is shared across replicas", self.name)


def build_limiter(config: QuotaConfig, redis_url: str | None, *, name: str) -> QuotaLimiter:
    """The shared limiter when Redis is configured (the quota is the account's), else the in-process one."""
    if redis_url is None:
        return LocalQuotaLimiter(config, name=name)
    return RedisQuotaLimiter(redis_url, config, name=name)


def _monotonic_us() -> int:
    return time.monotonic_ns() // 1000


_REASONS: dict[bytes, Reason] = {b"rate": "rate", b"concurrency": "concurrency", b"tokens": "tokens"}

# Shared by the scripts. Times are integer microseconds of Redis' clock (exact in a double up to 2^53);
# numbers go back into Redis through string.format, because Lua's tostring keeps only 14 digits.
_LUA_COMMON = """
if redis.replicate_commands then redis.replicate_commands() end  -- Redis < 5: allows writes after TIME
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function rate_wait(key, now)  -- GCRA: microseconds until the next admission (<= 0: now)
  return tonumber(redis.call('GET', key) or '0') - now
end
local function rate_take(key, now, interval)
  redis.call('SET', key, string.format('%d', now + interval), 'PX', math.ceil(interval / 1000) + 1000)
end
local function bucket_level(key, capacity, now)
  local state = redis.call('HMGET', key, 'level', 'at')
  if not state[1] then return capacity end
  return math.min(capacity, tonumber(state[1]) + (now - tonumber(state[2])) * capacity / 60000000)
end
local function bucket_store(key, capacity, level, now)
  redis.call('HSET', key, 'level', string.format('%.17g', level), 'at', string.format('%d', now))
  redis.call('PEXPIRE', key, math.ceil((capacity - level) * 60000 / capacity) + 1000)
end
"""

# KEYS: rate, slots, tokens. ARGV: lease, interval_us, max_concurrent, lease_us, tokens_per_minute (0: off), reserved.
# Returns {1, now} when admitted, else {0, wait_us, reason} having taken nothing.
_ACQUIRE_LUA = (
    _LUA_COMMON
    + """
local now = now_us()
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return {1, now} end  -- a retried call that already got in
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('%d', now))  -- leases of crashed holders
local full = redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3])
local wait, reason = rate_wait(KEYS[1], now), 'rate'
local capacity, reserved = tonumber(ARGV[5]), tonumber(ARGV[6])
local level = 0
if capacity > 0 then
  level = bucket_level(KEYS[3], capacity, now)
  local shortfall = math.ceil((reserved - level) * 60000000 / capacity)
  if shortfall > wait then wait, reason = shortfall, 'tokens' end
end
if full then return {0, math.max(wait, 0), 'concurrency'} end
if wait > 0 then return {0, wait, reason} end
local lease_us = tonumber(ARGV[4])
rate_take(KEYS[1], now, tonumber(ARGV[2]))
redis.call('ZADD', KEYS[2], string.format('%d', now + lease_us), ARGV[1])
redis.call('PEXPIRE', KEYS[2], math.ceil(lease_us / 1000) + 1000)
if capacity > 0 then bucket_store(KEYS[3], capacity, level - reserved, now) end
return {1, now}
"""
)

# KEYS: slots, tokens, the lease's settled mark. ARGV: lease, tokens_per_minute (0: off), token correction,
# only_if_held (1: a cleanup). The mark makes the correction happen once: redis-py runs the script again
# when its reply was lost (a timeout or a reset after it ran), and the lease may have expired meanwhile.
_RELEASE_LUA = (
    _LUA_COMMON
    + """
local held = redis.call('ZREM', KEYS[1], ARGV[1])
local capacity, correction = tonumber(ARGV[2]), tonumber(ARGV[3])
if (held == 1 or ARGV[4] == '0') and capacity > 0 and correction ~= 0
    and redis.call('SET', KEYS[3], '1', 'NX', 'PX', 60000) then
  local now = now_us()
  bucket_store(KEYS[2], capacity, math.min(capacity, bucket_level(KEYS[2], capacity, now) - correction), now)
end
return held
"""
)

# KEYS: rate. ARGV: interval_us. The rate alone, for another attempt inside a held slot (`Slot.pace`).
# Returns {1, now} when admitted, else {0, wait_us}.
_PACE_LUA = (
    _LUA_COMMON
    + """
local now = now_us()
local wait = rate_wait(KEYS[1], now)
if wait > 0 then return {0, wait} end
rate_take(KEYS[1], now, tonumber(ARGV[1]))
return {1, now}
"""
)

# KEYS: slots. ARGV: lease, lease_us. Returns 0 when the lease is gone (expired, or Redis lost it).
_RENEW_LUA = (
    _LUA_COMMON
    + """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local lease_us = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', string.format('%d', now_us() + lease_us), ARGV[1])
redis.call('PEXPIRE', KEYS[1], math.ceil(lease_us / 1000) + 1000)
return 1
"""
)
