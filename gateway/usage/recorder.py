"""`UsageRecorder`: prices an answered request, counts it in the team metrics and stores its record in the
background (the answer never waits for the store; a failed write is counted and logged, never raised)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
import uuid

from gateway import metrics
from gateway.keys import names
from gateway.keys.limiter import KeyLimiter
from gateway.keys.model import ApiKey
from gateway.keys.resolver import KeyResolver
from gateway.redis_client import OUTAGES, REDIS_FAILURES
from gateway.usage.pricing import PriceTable
from gateway.usage.record import Usage
from gateway.usage.store import RedisUsageStore, UsageEntry, UsageStore

log = logging.getLogger(__name__)


class UsageRecorder:
    def __init__(self, store: UsageStore, prices: PriceTable, limiter: KeyLimiter, resolver: KeyResolver) -> None:
        self.store = store
        self._prices = prices
        self._limiter = limiter
        self._resolver = resolver
        self._writes: set[asyncio.Task[None]] = set()
        self._failing = False

    def record(self, key: ApiKey, model: str, usage: Usage, request_id: str | None = None) -> tuple[Usage, bool]:
        """Add `usage` to the key's record for `model` today, written in the background; returns it priced, and
        whether a price applied. `request_id` makes the record idempotent (e.g. a video task's id)."""
        priced, has_price, _ = self._start(key, model, usage, request_id)
        return priced, has_price

    async def record_durably(
        self, key: ApiKey, model: str, usage: Usage, request_id: str | None = None
    ) -> tuple[Usage, bool]:
        """`record`, returning once the record is stored (or its write failed): for paid answers (chat, video),
        so that an answer a client got is on record even if the process dies right after. The write is shielded:
        a client that leaves meanwhile does not cancel it."""
        priced, has_price, write = self._start(key, model, usage, request_id)
        await asyncio.shield(write)
        return priced, has_price

    def _start(
        self, key: ApiKey, model: str, usage: Usage, request_id: str | None
    ) -> tuple[Usage, bool, asyncio.Task[None]]:
        priced, has_price = self._prices.priced(model, usage)
        self._count(key.team, priced)
        now = time.time()
        entry = UsageEntry(
            request_id or uuid.uuid4().hex,
            names.day_of(now),
            names.month_of(now),
            key.id,
            key.prefix,
            key.team,
            model,
            priced,
        )
        task = asyncio.ensure_future(self._write(entry))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return priced, has_price, task

    async def flush(self) -> None:
        """Wait for the writes under way (tests, shutdown)."""
        await asyncio.gather(*self._writes, return_exceptions=True)

    async def aclose(self) -> None:
        await self.flush()
        await self.store.aclose()

    async def _write(self, entry: UsageEntry) -> None:
        try:
            added = await self.store.add(entry)
        except (*REDIS_FAILURES, OSError, ValueError, sqlite3.Error) as exc:
            metrics.USAGE_WRITE_ERRORS.inc()
            if not self._failing:
                # A Redis outage (or its open circuit) is logged once by the Redis circuit, for all its users.
                outage = isinstance(self.store, RedisUsageStore) and isinstance(exc, OUTAGES)
                level = logging.DEBUG if outage else logging.WARNING
                log.log(level, "usage records not stored (%s); requests are still answered", type(exc).__name__)
            self._failing = True
            return
        self._failing = False
        if added:
            subjects = (names.key_subject(entry.key_id), names.team_subject(entry.team))
            spent = [names.spend_key(entry.month, subject) for subject in subjects]
            await self._limiter.add_spend(spent, entry.usage.cost, entry.usage.tokens)

    def _count(self, team: str, usage: Usage) -> None:
        label = team if team in self._resolver.teams() else "other"
        metrics.USAGE_REQUESTS.labels(team=label).inc(usage.requests)
        for kind, value in (
            ("prompt", usage.prompt_tokens),
            ("completion", usage.completion_tokens),
            ("reasoning", usage.reasoning_tokens),
            ("embedding", usage.embedding_tokens),
        ):
            if value:
                metrics.USAGE_TOKENS.labels(team=label, kind=kind).inc(value)
        if usage.cost:
            metrics.USAGE_COST.labels(team=label).inc(usage.cost)
