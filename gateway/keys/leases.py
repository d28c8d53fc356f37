"""`RateLeases`: requests-per-minute limits large enough to lease are admitted from tokens this replica leased
from Redis, so that a request under such a limit waits for no Redis round trip.

A limit of L per minute admits L requests back to back from idle, then one per interval I = 60 s / L (the GCRA
of `lua/admit.lua` with a burst of L, whose state, the TAT, the leases share). Where `WINDOW_US` holds at least
`MIN_LEASE` intervals, a replica leases tokens (`lua/lease.lua`): each token advances the TAT by one interval, and
a token is granted only where the exact check would admit a request (the TAT stays within L intervals of now), so
Redis hands out no more than the burst and the rate, to leases and exact checks together. A replica asks for
what it used in the last `HORIZON_SECONDS` (at most one window's worth), renews in the background once half of it
is spent or the lease is half way to `EXPIRY_SECONDS` (the request that triggers it does not wait), and drops what
it still holds at expiry (a lease nobody uses is not handed back: its slots are lost, as a GCRA slot nobody asks
for is). So over any period T the replicas together admit at most L + (T + replicas x window) / I: the burst, the
rate, and the tokens each replica held when T began. Smaller limits keep the exact check per request: their lease
would be a token or two, and tokens one replica holds unused are a large share of the limit lost to the others.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.background import cancel_and_wait
from gateway.keys.checks import Check, Refusal
from gateway.redis_client import REDIS_FAILURES

log = logging.getLogger(__name__)

WINDOW_US = 100_000  # the most tokens a replica holds, in intervals of the limit
MIN_LEASE = 8  # intervals per window below which a limit is checked exactly (under 4,800 per minute)
HORIZON_SECONDS = 0.5  # a lease covers this long at the rate the replica used lately
RATE_SPAN_SECONDS = 0.05  # the shortest span a used rate is reckoned over (the first lease asks for little)
EXPIRY_SECONDS = 1.0  # tokens still held this long after their lease are dropped
MAX_LEASES = 10_000  # subjects with a lease kept (keys x route families, teams)
ATTEMPTS = 3  # renewals a request waits for before it takes the exact check instead

# (tokens granted, µs until one would fit: only when none was); raises what a Redis call raises.
LeaseCall = Callable[[Check, int], Awaitable[tuple[int, int]]]


@dataclass
class _Lease:
    tokens: int = 0
    expires: float = 0.0  # monotonic seconds
    target: int = 1  # tokens a lease should leave the replica holding
    used: int = 0  # taken since the last renewal was sent
    renewed_at: float = 0.0
    refused_until: float = 0.0  # Redis had no token to lease before this
    failed: bool = False  # the last renewal got no answer from Redis
    renewal: asyncio.Task[None] | None = None


def window_tokens(check: Check) -> int:
    """How many of a rate check's intervals one window holds."""
    return WINDOW_US // max(int(check.a), 1)


def leasable(check: Check) -> bool:
    return check.kind == "rate" and window_tokens(check) >= MIN_LEASE


class RateLeases:
    def __init__(self, lease: LeaseCall) -> None:
        self._lease = lease
        self._leases: dict[str, _Lease] = {}

    async def take(self, check: Check) -> bool | Refusal | None:
        """One token of the check's lease: True, a `Refusal` (Redis has none to lease), or None when no lease
        could be had (Redis failed): the caller takes the exact check."""
        lease = self._leases.get(check.key)
        if lease is None:
            if len(self._leases) >= MAX_LEASES:
                self._leases = {k: v for k, v in self._leases.items() if v.renewal is not None}
            lease = self._leases[check.key] = _Lease()
        for _ in range(ATTEMPTS):
            now = time.monotonic()
            if lease.tokens and now >= lease.expires:
                lease.tokens = 0
            if lease.tokens:
                lease.tokens -= 1
                lease.used += 1
                if lease.tokens * 2 < lease.target or now >= lease.expires - EXPIRY_SECONDS / 2:
                    self._renew(check, lease)
                return True
            if now < lease.refused_until:
                return Refusal(check, lease.refused_until - now)
            await asyncio.shield(self._renew(check, lease))
            if lease.failed:
                return None
        return None

    def give_back(self, check: Check) -> None:
        """A token taken for a request another check refused."""
        lease = self._leases.get(check.key)
        if lease is not None:
            lease.tokens += 1
            lease.used -= 1

    async def aclose(self) -> None:
        renewals = [lease.renewal for lease in self._leases.values() if lease.renewal is not None]
        if renewals:
            await cancel_and_wait(*renewals, name="rate lease renewals")

    def _renew(self, check: Check, lease: _Lease) -> asyncio.Task[None]:
        if lease.renewal is None:
            lease.renewal = asyncio.ensure_future(self._renewal(check, lease))
        return lease.renewal

    async def _renewal(self, check: Check, lease: _Lease) -> None:
        now = time.monotonic()
        span = max(now - lease.renewed_at, RATE_SPAN_SECONDS) if lease.renewed_at else RATE_SPAN_SECONDS
        limit = window_tokens(check)
        target = min(limit, max(1, math.ceil(lease.used / span * HORIZON_SECONDS)))
        lease.used, lease.renewed_at, lease.target, lease.failed = 0, now, target, True
        try:
            granted, wait_us = await self._lease(check, max(1, min(target, limit) - lease.tokens))
        except REDIS_FAILURES:
            return  # the requests take the exact check (and its fallback) until a renewal succeeds
        except Exception:  # a bug must not leave the requests waiting on a renewal for ever
            log.exception("leasing requests-per-minute tokens failed")
            return
        finally:
            lease.renewal = None
        lease.failed = False
        if granted:
            lease.tokens += granted
            lease.expires = now + EXPIRY_SECONDS
        else:
            lease.refused_until = now + wait_us / 1e6
