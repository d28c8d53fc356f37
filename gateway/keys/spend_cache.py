"""`SpendCache`: monthly budgets checked against a copy of the spend that this replica keeps, so that a request
waits for no Redis round trip to learn that its key's and team's budgets are not spent.

A month's spend only grows, so the copy errs one way only: a budget the copy finds spent is spent (refused at
once, with the limit as configured now), and one it finds unspent may have been spent by other replicas since the
copy was read. The copy is read again in the background once it is `REFRESH_SECONDS` old (the request that
notices uses it meanwhile), and this replica's own records are added to it as they are stored; a copy older than
`STALE_SECONDS` (Redis does not answer) decides nothing: the exact check in Redis (and its fallback) does. So a
budget spent on another replica is in force here within about `REFRESH_SECONDS`, and one spent here at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.background import cancel_and_wait
from gateway.keys.checks import Check, Refusal
from gateway.redis_client import REDIS_FAILURES

log = logging.getLogger(__name__)

REFRESH_SECONDS = 0.25
STALE_SECONDS = 2.0
MAX_ENTRIES = 10_000  # spend counters kept (keys and teams with a budget, this month)

# A spend counter's (cost, tokens) in Redis; raises what a Redis call raises.
SpendRead = Callable[[str], Awaitable[tuple[float, float]]]


@dataclass
class _Spent:
    cost: float
    tokens: float
    read_at: float  # monotonic seconds: when the read was sent


class SpendCache:
    def __init__(self, read: SpendRead) -> None:
        self._read = read
        self._spent: dict[str, _Spent] = {}
        self._wanted: set[str] = set()
        self._refresh: asyncio.Task[None] | None = None

    def verdict(self, check: Check) -> bool | Refusal | None:
        """A budget check decided from the copy: True (not spent), a `Refusal`, or None (no fresh copy)."""
        spent = self._spent.get(check.key)
        now = time.monotonic()
        if spent is None or now - spent.read_at >= REFRESH_SECONDS:
            self._want(check.key)
            if spent is None or now - spent.read_at >= STALE_SECONDS:
                return None
        used = spent.tokens if check.b == "tokens" else spent.cost
        return Refusal(check, check.c / 1e6) if used >= float(check.a) else True

    def add(self, keys: list[str], cost: float, tokens: int) -> None:
        """This replica's own record, stored: in force here before the next read."""
        for key in keys:
            spent = self._spent.get(key)
            if spent is not None:
                spent.cost += cost
                spent.tokens += tokens

    async def aclose(self) -> None:
        if self._refresh is not None:
            await cancel_and_wait(self._refresh, name="budget spend refresh")

    def _want(self, key: str) -> None:
        self._wanted.add(key)
        if self._refresh is None:
            self._refresh = asyncio.ensure_future(self._refreshed())

    async def _refreshed(self) -> None:
        try:
            wanted, self._wanted = list(self._wanted), set()
            sent = time.monotonic()
            read = await asyncio.gather(*(self._read(key) for key in wanted))
        except REDIS_FAILURES:
            return  # the copies age; past STALE_SECONDS the exact check decides
        except Exception:  # a bug must not stop the refreshes for good
            log.exception("reading the budgets' spend failed")
            return
        finally:
            self._refresh = None
        if len(self._spent) + len(wanted) > MAX_ENTRIES:
            self._spent.clear()
        for key, (cost, tokens) in zip(wanted, read, strict=True):
            known = self._spent.get(key)
            if known is not None:  # the larger: a record added here may have been stored after the read
                cost, tokens = max(cost, known.cost), max(tokens, known.tokens)
            self._spent[key] = _Spent(cost, tokens, sent)
