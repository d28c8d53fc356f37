"""`LocalQuotaLimiter`: the quota kept in this process alone."""

from __future__ import annotations

import math

from gateway.quota.base import Denial, Grant, QuotaConfig
from gateway.quota.in_process import InProcessQuota
from gateway.quota.waiting import WaitingLimiter


class LocalQuotaLimiter(WaitingLimiter):
    """The quota for this process alone: right for one replica, N times the quota for N replicas."""

    def __init__(self, config: QuotaConfig | None = None, *, name: str = "upstream") -> None:
        # Every release in process wakes the head of the queue, so a full limit needs no polling.
        super().__init__(config or QuotaConfig(), name, poll_seconds=math.inf)
        self._quota = InProcessQuota(self.config)

    async def _attempt(self, reserved: int) -> Grant | Denial:
        return self._quota.try_take(reserved)

    async def _attempt_pace(self) -> Grant | Denial:
        return self._quota.try_pace()

    async def _release(self, grant: Grant, token_correction: int) -> None:
        self._quota.give_back(token_correction)
        self._wakeup.notify()
