"""`UsageRecorder`: prices an answered request, counts it in the team metrics and stores its record in the
background (the answer never waits for the store; a failed write is counted and logged, never raised).

Records are written by one writer task in batches (one Redis pipeline, or one SQLite transaction, per batch):
a record of an answer already sent waits up to `BATCH_SECONDS` for others; a durable one (a paid answer) and a
`flush()` are written at once. With Redis, a batch Redis did not take goes to the local spool (`UsageSpool`),
which a replay task writes to Redis again once it answers, and at the next start after a kill.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sqlite3
import time
import uuid
from contextlib import suppress

from gateway import metrics
from gateway.background import cancel_and_wait
from gateway.keys import names
from gateway.keys.limiter import KeyLimiter
from gateway.keys.model import ApiKey
from gateway.keys.resolver import KeyResolver
from gateway.redis_client import OUTAGES, REDIS_FAILURES
from gateway.usage.pricing import PriceTable
from gateway.usage.record import Usage
from gateway.usage.spool import SPOOL_FAILURES, UsageSpool
from gateway.usage.store import RedisUsageStore, UsageEntry, UsageStore

log = logging.getLogger(__name__)

BATCH_SECONDS = 0.25  # how long a record of an answer already sent waits for others to share its write
BATCH_RECORDS = 500  # records per pipeline (or transaction), and per replayed batch of the spool
REPLAY_SECONDS = 1.0  # how often the spool is tried again while it holds records
WRITE_FAILURES = (*REDIS_FAILURES, OSError, ValueError, sqlite3.Error)


class UsageRecorder:
    def __init__(
        self,
        store: UsageStore,
        prices: PriceTable,
        limiter: KeyLimiter,
        resolver: KeyResolver,
        spool: UsageSpool | None = None,
    ) -> None:
        self.store = store
        self.spool = spool
        self._prices = prices
        self._limiter = limiter
        self._resolver = resolver
        self._queue: list[UsageEntry] = []
        self._waiters: list[asyncio.Future[None]] = []  # resolved once every record queued before them is written
        self._pending = asyncio.Event()  # records are queued
        self._due = asyncio.Event()  # someone waits for them: write without waiting for more
        self._writer: asyncio.Task[None] | None = None
        self._replayer: asyncio.Task[None] | None = None
        self._spooled = spool is not None  # the spool may hold records (a killed process's, at the start)
        self._failing = False
        self._dropping = False
        # Request ids of records without one: unique to this process (its random prefix) and cheap to make.
        self._id_prefix = uuid.uuid4().hex[:16] + "-"
        self._ids = itertools.count()
        self._today: tuple[float, str, str] = (0.0, "", "")  # until (epoch s), day, month: one gmtime a day
        self._team_counters: dict[str, _TeamCounters] = {}

    def start(self) -> None:
        """Start replaying the spool (records a killed process left in it first)."""
        if self.spool is not None and self._replayer is None:
            self._replayer = asyncio.ensure_future(self._replay_loop())

    def record(self, key: ApiKey, model: str, usage: Usage, request_id: str | None = None) -> tuple[Usage, bool]:
        """Add `usage` to the key's record for `model` today, written in the background; returns it priced, and
        whether a price applied. `request_id` makes the record idempotent (e.g. a video task's id)."""
        return self._queued(key, model, usage, request_id)

    async def record_durably(
        self, key: ApiKey, model: str, usage: Usage, request_id: str | None = None
    ) -> tuple[Usage, bool]:
        """`record`, returning once the record is stored, in the store or the spool (or its write failed): for
        paid answers (chat, video), so that an answer a client got is on record even if the process dies right
        after. The write is not cancelled by a client that leaves meanwhile."""
        priced, has_price = self._queued(key, model, usage, request_id)
        await asyncio.shield(self._written())
        return priced, has_price

    async def flush(self) -> None:
        """Wait until every record queued so far is written (the usage API reads its own replica's writes)."""
        if self._writer is not None:
            await asyncio.shield(self._written())

    async def aclose(self) -> None:
        await self.flush()
        # The replay loop survives Redis errors, the way a cancel landing in a Redis call can come out.
        await cancel_and_wait(*(t for t in (self._writer, self._replayer) if t is not None), name="usage recorder")
        if self.spool is not None:
            await self.spool.aclose()
        await self.store.aclose()

    def _queued(self, key: ApiKey, model: str, usage: Usage, request_id: str | None) -> tuple[Usage, bool]:
        priced, has_price = self._prices.priced(model, usage)
        self._count(key.team, priced)
        now = time.time()
        until, day, month = self._today
        if now >= until:
            until, day, month = now + names.seconds_to_next_day(now), names.day_of(now), names.month_of(now)
            self._today = (until, day, month)
        entry = UsageEntry(
            request_id or f"{self._id_prefix}{next(self._ids)}",
            day,
            month,
            key.id,
            key.prefix,
            key.team,
            model,
            priced,
            id_may_repeat=request_id is not None,
        )
        self._queue.append(entry)
        self._pending.set()
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write_loop())
        return priced, has_price

    def _written(self) -> asyncio.Future[None]:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._due.set()
        self._pending.set()
        return waiter

    async def _write_loop(self) -> None:
        while True:
            await self._pending.wait()
            if not self._due.is_set():
                with suppress(TimeoutError):
                    async with asyncio.timeout(BATCH_SECONDS):
                        await self._due.wait()
            self._pending.clear()
            self._due.clear()
            batch, self._queue = self._queue, []
            waiters, self._waiters = self._waiters, []
            try:
                for first in range(0, len(batch), BATCH_RECORDS):
                    chunk = batch[first : first + BATCH_RECORDS]
                    try:
                        await self._write(chunk)
                    except Exception:  # a bug must not stop the writer: every later record would wait on it
                        log.exception("usage records not stored")
                        metrics.USAGE_WRITE_ERRORS.inc(len(chunk))
            finally:
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)

    async def _write(self, entries: list[UsageEntry]) -> None:
        try:
            added = await self.store.add_many(entries)
        except WRITE_FAILURES as exc:
            if self.spool is not None:
                await self._spool(entries)
            else:
                self._lost(len(entries), exc)
            return
        self._failing = False
        await self._spent(entries, added)

    async def _spent(self, entries: list[UsageEntry], added: list[bool]) -> None:
        """The in-process budgets grow with the records that were new (in Redis the record script does it)."""
        for entry, new in zip(entries, added, strict=True):
            if new:
                subjects = (names.key_subject(entry.key_id), names.team_subject(entry.team))
                spent = [names.spend_key(entry.month, subject) for subject in subjects]
                await self._limiter.add_spend(spent, entry.usage.cost, entry.usage.tokens)

    async def _spool(self, entries: list[UsageEntry]) -> None:
        assert self.spool is not None
        try:
            dropped = await self.spool.put(entries)
        except SPOOL_FAILURES as exc:
            self._lost(len(entries), exc)
            return
        self._spooled = True
        metrics.USAGE_SPOOLED.inc(len(entries) - dropped)
        if dropped:
            metrics.USAGE_SPOOL_DROPPED.inc(dropped)
            if not self._dropping:
                self._dropping = True
                log.warning(
                    "usage spool full (%d records, GATEWAY_USAGE_SPOOL_MAX_RECORDS): records of this outage are "
                    "dropped until Redis takes the spooled ones",
                    self.spool.max_records,
                )

    def _lost(self, count: int, exc: BaseException) -> None:
        metrics.USAGE_WRITE_ERRORS.inc(count)
        if not self._failing:
            # A Redis outage (or its open circuit) is logged once by the Redis circuit, for all its users.
            outage = isinstance(self.store, RedisUsageStore) and isinstance(exc, OUTAGES)
            level = logging.DEBUG if outage else logging.WARNING
            log.log(level, "usage records not stored (%s); requests are still answered", type(exc).__name__)
        self._failing = True

    async def _replay_loop(self) -> None:
        while True:
            with suppress(*WRITE_FAILURES, *SPOOL_FAILURES):  # tried again at the next turn
                while self._spooled and self._store_answers() and await self._replay_batch():
                    pass
            await asyncio.sleep(REPLAY_SECONDS)

    def _store_answers(self) -> bool:
        """Whether Redis answered last time (no spooled batch is read while its circuit is open)."""
        return not isinstance(self.store, RedisUsageStore) or self.store.answers()

    async def _replay_batch(self) -> bool:
        """Write the spool's oldest batch to the store and remove it from the spool; whether one was written."""
        assert self.spool is not None
        batch = await self.spool.take(BATCH_RECORDS)
        if not batch:
            self._spooled = self._dropping = False
            return False
        entries = [entry for _, entry in batch]
        await self._spent(entries, await self.store.add_many(entries))
        await self.spool.remove([row_id for row_id, _ in batch])
        metrics.USAGE_REPLAYED.inc(len(batch))
        return True

    def _count(self, team: str, usage: Usage) -> None:
        label = team if team in self._resolver.teams() else "other"
        counters = self._team_counters.get(label)
        if counters is None:  # the label set is bounded (configured teams), so is this
            counters = self._team_counters[label] = _TeamCounters(label)
        counters.requests.inc(usage.requests)
        for kind, counter in counters.tokens.items():
            value = getattr(usage, f"{kind}_tokens")
            if value:
                counter.inc(value)
        if usage.cost:
            counters.cost.inc(usage.cost)


class _TeamCounters:
    """One team's usage metrics, labelled once (a `labels()` lookup per request and metric is not free)."""

    def __init__(self, team: str) -> None:
        self.requests = metrics.USAGE_REQUESTS.labels(team=team)
        kinds = ("prompt", "completion", "reasoning", "embedding")
        self.tokens = {kind: metrics.USAGE_TOKENS.labels(team=team, kind=kind) for kind in kinds}
        self.cost = metrics.USAGE_COST.labels(team=team)
