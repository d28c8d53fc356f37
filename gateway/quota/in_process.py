"""The three limits in process memory, with the same arithmetic as the Lua scripts in `lua/`: the state of
`LocalQuotaLimiter`, and of `RedisQuotaLimiter` while Redis is unreachable."""

from __future__ import annotations

import math
import time

from gateway.quota.base import Denial, Grant, QuotaConfig, Reason


class InProcessQuota:
    """Rate (GCRA), concurrent calls and the token bucket of one process, all taken together or not at all."""

    def __init__(self, config: QuotaConfig) -> None:
        self.config = config
        self._held = 0
        self._tat = 0
        self._capacity = config.tokens_per_minute or 0
        self._level = float(self._capacity)
        self._level_at = _monotonic_us()

    def try_take(self, reserved: int) -> Grant | Denial:
        now = _monotonic_us()
        level = self._refilled(now)
        wait: int = self._tat - now
        reason: Reason = "rate"
        shortfall = math.ceil((reserved - level) * 60_000_000 / self._capacity) if self._capacity else 0
        if shortfall > wait:
            wait, reason = shortfall, "tokens"
        if self._held >= self.config.max_concurrent:
            return Denial("concurrency", max(wait, 0) / 1e6, reserved)
        if wait > 0:
            return Denial(reason, wait / 1e6, reserved)
        self._tat = now + self.config.interval_us
        self._held += 1
        self._level, self._level_at = level - reserved, now
        return Grant(admitted_at=now / 1e6)

    def try_pace(self) -> Grant | Denial:
        """The rate alone, for another attempt of a call that holds its slot and tokens."""
        now = _monotonic_us()
        if self._tat > now:
            return Denial("rate", (self._tat - now) / 1e6)
        self._tat = now + self.config.interval_us
        return Grant(admitted_at=now / 1e6)

    def give_back(self, token_correction: int) -> None:
        self._held -= 1
        if self._capacity and token_correction:
            now = _monotonic_us()
            self._level, self._level_at = min(self._capacity, self._refilled(now) - token_correction), now

    def _refilled(self, now: int) -> float:
        return min(self._capacity, self._level + (now - self._level_at) * self._capacity / 60_000_000)


def _monotonic_us() -> int:
    return time.monotonic_ns() // 1000
