"""`RedisQuotaLimiter`: the quota shared by every replica through atomic Lua scripts (`lua/`) on Redis, with
the in-process quota as the fallback while Redis is unreachable, give-backs retried in the background, and
leases renewed while their calls run."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Coroutine
from importlib.resources import files
from typing import Any

from gateway import metrics
from gateway.background import cancel_and_wait
from gateway.quota.base import Denial, Grant, QuotaConfig, Reason
from gateway.quota.in_process import InProcessQuota
from gateway.quota.waiting import WaitingLimiter
from gateway.redis_client import REDIS_FAILURES, RedisConnection, RedisSkippedError

log = logging.getLogger(__name__)

_REASONS: dict[bytes, Reason] = {b"rate": "rate", b"concurrency": "concurrency", b"tokens": "tokens"}


def _lua_script(name: str) -> str:
    """The script `lua/<name>.lua` after `lua/prelude.lua`, the functions every script shares (package data,
    so it is found in a wheel as in a checkout)."""
    folder = files("gateway.quota").joinpath("lua")
    return "\n".join(folder.joinpath(f"{part}.lua").read_text(encoding="utf-8") for part in ("prelude", name))


class RedisQuotaLimiter(WaitingLimiter):
    """The quota shared by every replica through Redis, on Redis' clock; the local one while Redis is down.

    Keys share the hash tag `{name}` by default so the scripts also run on a Redis Cluster. Redis failures
    never fail a request: the call is limited in process instead. Calls go through the circuit of `redis` (the
    process's shared `RedisConnection`, or a URL for one of its own), which skips Redis for a back-off window
    after a timeout and logs the outage once. The URL may hold a password: it is never logged.
    """

    def __init__(
        self,
        redis: str | RedisConnection,
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
        self._redis = RedisConnection.shared(redis, timeout_seconds=timeout_seconds, backoff_seconds=backoff_seconds)
        self._client = self._redis.client
        self._acquire = self._client.register_script(_lua_script("acquire"))
        self._release_script = self._client.register_script(_lua_script("release"))
        self._pace_script = self._client.register_script(_lua_script("pace"))
        self._renew = self._client.register_script(_lua_script("renew"))
        self._fallback = InProcessQuota(self.config)
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
        await cancel_and_wait(*self._renewals.values(), *self._retries, name=f"{self.name} quota lease renewals")
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._redis.aclose()

    async def _attempt(self, reserved: int) -> Grant | Denial:
        lease = uuid.uuid4().hex
        try:
            reply = await self._redis.call(
                lambda: self._acquire(keys=self._keys(), args=self._acquire_args(lease, reserved))
            )
        except RedisSkippedError as exc:
            self._fall_back(exc)
            return self._granted_alone(reserved)  # the script did not run: nothing to give back
        except asyncio.CancelledError:
            self._forget(lease, reserved)  # the script may have run: free what it took
            raise
        except REDIS_FAILURES as exc:
            self._fall_back(exc)
            self._forget(lease, reserved)
            return self._granted_alone(reserved)
        self._recovered()
        return self._verdict(reply, lease, reserved)

    async def _attempt_pace(self) -> Grant | Denial:
        try:
            reply = await self._redis.call(
                lambda: self._pace_script(keys=[self._rate_key], args=[self.config.interval_us])
            )
        except REDIS_FAILURES as exc:
            self._fall_back(exc)
            return self._fallback.try_pace()
        self._recovered()
        if int(reply[0]) == 1:
            return Grant(admitted_at=int(reply[1]) / 1e6)
        return Denial("rate", int(reply[1]) / 1e6)

    async def _release(self, grant: Grant, token_correction: int) -> None:
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

    def _verdict(self, reply: list[Any], lease: str, reserved: int) -> Grant | Denial:
        if int(reply[0]) == 1:
            self._renewals[lease] = asyncio.ensure_future(self._keep_renewed(lease))
            return Grant(admitted_at=int(reply[1]) / 1e6, lease=lease)
        return Denial(_REASONS[bytes(reply[2])], int(reply[1]) / 1e6, reserved)

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
        backoff_seconds = self._redis.circuit.backoff_seconds
        while time.monotonic() + backoff_seconds < give_up_at:
            await asyncio.sleep(backoff_seconds)
            if await self._give_back_once(lease, token_correction, only_if_held):
                return

    async def _give_back_once(self, lease: str, token_correction: int, only_if_held: bool) -> bool:
        args: list[str | int] = [lease, self.config.tokens_per_minute or 0, token_correction, int(only_if_held)]
        try:
            keys = [self._slots_key, self._tokens_key, f"{self._tokens_key}:settled:{lease}"]
            await self._redis.call(lambda: self._release_script(keys=keys, args=args))
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
                if not await self._redis.call(lambda: self._renew(keys=[self._slots_key], args=args)):
                    log.warning("%s quota: lease %s expired while held (Redis restarted?)", self.name, lease)
                    return
            except REDIS_FAILURES:
                continue  # the next renewal may get through; the lease outlives two misses

    def _background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _granted_alone(self, reserved: int) -> Grant | Denial:
        verdict = self._fallback.try_take(reserved)
        if isinstance(verdict, Grant):
            metrics.QUOTA_FALLBACKS.labels(limiter=self.name).inc()
        return verdict

    def _fall_back(self, exc: BaseException) -> None:
        """Limit this replica alone; its Redis slots free themselves after `lease_seconds`. Logged at DEBUG:
        the Redis circuit logs the outage once for every user."""
        if not self._degraded:
            self._degraded = True
            metrics.QUOTA_DEGRADED.labels(limiter=self.name).set(1)
            log.debug("%s quota: Redis unreachable (%s); limiting this replica alone", self.name, exc)

    def _recovered(self) -> None:
        if self._degraded:
            self._degraded = False
            metrics.QUOTA_DEGRADED.labels(limiter=self.name).set(0)
            log.debug("%s quota: Redis answers again; the quota is shared across replicas", self.name)
