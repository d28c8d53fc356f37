"""Where usage records are kept: Redis (every replica adds to the same counters) or SQLite (one process).

A record is added once per request id (a retried write of the same request is not counted twice), to the
counters of its key x model x UTC day; the spend of the key and its team for the month grows with it (the
budgets read it). Rows carry the team and key prefix as they were when the request was answered.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date, timedelta
from importlib.resources import files
from pathlib import Path
from typing import Any, Protocol, TypeVar

from redis.exceptions import NoScriptError

from gateway.errors import UpstreamUnavailableError
from gateway.keys.names import PREFIX, key_subject, spend_key, team_subject
from gateway.redis_client import REDIS_FAILURES, RedisConnection
from gateway.usage.record import COUNTERS, Usage

SEEN_SECONDS = 2 * 86400  # how long a request id is remembered: longer than any retry of its write
RETENTION_SECONDS = 400 * 86400

T = TypeVar("T")


@dataclass(frozen=True)
class UsageEntry:
    """One request's record, as written."""

    request_id: str
    day: str
    month: str
    key_id: str
    key_prefix: str
    team: str
    model: str
    usage: Usage
    # False for an id this process made, unique by construction: a store that writes each batch at most once
    # (SQLite, which has no spool to replay) need not remember it to count it once.
    id_may_repeat: bool = True


@dataclass(frozen=True)
class UsageRow:
    """The counters of one key x model x day."""

    day: str
    key_id: str
    key_prefix: str
    team: str
    model: str
    counters: dict[str, float]


class UsageStore(Protocol):
    async def add_many(self, entries: Sequence[UsageEntry]) -> list[bool]:
        """Add the records together; for each, whether it was new (False: its request id was seen already)."""

    async def rows(self, start: date, end: date) -> list[UsageRow]: ...

    async def aclose(self) -> None: ...


def _days(start: date, end: date) -> list[str]:
    return [(start + timedelta(days=n)).isoformat() for n in range((end - start).days + 1)]


class RedisUsageStore:
    """Per day a set of `key_id\\tmodel` members and a hash of counters for each (`lua/record.lua`). Calls go
    through the circuit of `redis` (the process's shared `RedisConnection`, or a URL for one of its own): while
    it is open a record fails at once, as on any Redis failure (the recorder counts and logs it)."""

    def __init__(self, redis: str | RedisConnection, timeout_seconds: float = 0.25) -> None:
        self._redis = RedisConnection.shared(redis, timeout_seconds=timeout_seconds)
        self._client = self._redis.client
        script = files("gateway.usage").joinpath("lua").joinpath("record.lua").read_text(encoding="utf-8")
        self._record = self._client.register_script(script)

    def __repr__(self) -> str:
        return "RedisUsageStore()"  # no URL: it may hold a password

    def answers(self) -> bool:
        """Whether Redis answered last time, without waiting on it (its circuit is closed)."""
        return self._redis.known_up()

    async def add_many(self, entries: Sequence[UsageEntry]) -> list[bool]:
        """One pipeline of record scripts (EVALSHA) for the whole batch: one round trip however many records.
        A Redis that lost its script cache (a restart) gets the script and the batch again: the records already
        added are not counted twice (their request ids were seen)."""
        if not entries:
            return []
        commands = [_record_command(entry) for entry in entries]
        replies = await self._redis.call(lambda: self._evalsha(commands))
        if any(isinstance(reply, NoScriptError) for reply in replies):
            await self._redis.call(lambda: self._client.script_load(self._record.script))
            replies = await self._redis.call(lambda: self._evalsha(commands))
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return [bool(reply) for reply in replies]

    async def _evalsha(self, commands: list[tuple[list[str], list[str | float]]]) -> list[Any]:
        async with self._client.pipeline(transaction=False) as pipe:
            for keys, args in commands:
                pipe.evalsha(self._record.sha, len(keys), *keys, *args)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        return replies

    async def rows(self, start: date, end: date) -> list[UsageRow]:
        try:
            return await self._redis.call(lambda: self._rows(start, end))
        except REDIS_FAILURES as exc:
            raise UpstreamUnavailableError("usage store (Redis) unreachable; retry shortly", detail=str(exc)) from None

    async def _rows(self, start: date, end: date) -> list[UsageRow]:
        days = _days(start, end)
        async with self._client.pipeline(transaction=False) as pipe:
            for day in days:
                pipe.smembers(f"{PREFIX}usage:{day}")
            members = await pipe.execute()
        wanted = [(day, m.decode()) for day, found in zip(days, members, strict=True) for m in sorted(found)]
        async with self._client.pipeline(transaction=False) as pipe:
            for day, member in wanted:
                pipe.hgetall(f"{PREFIX}usage:{day}:{member}")
            hashes = await pipe.execute()
        rows = []
        for (day, member), raw in zip(wanted, hashes, strict=True):
            fields = {k.decode(): v.decode() for k, v in raw.items()}
            key_id, _, model = member.partition("\t")
            counters = {name: float(fields.get(name, 0)) for name in COUNTERS}
            rows.append(UsageRow(day, key_id, fields.get("key_prefix", ""), fields.get("team", ""), model, counters))
        return rows

    async def aclose(self) -> None:
        await self._redis.aclose()


def _record_command(entry: UsageEntry) -> tuple[list[str], list[str | float]]:
    """The keys and arguments of `lua/record.lua` for one record."""
    member = f"{entry.key_id}\t{entry.model}"
    keys = [
        f"{PREFIX}usage:seen:{entry.request_id}",
        f"{PREFIX}usage:{entry.day}:{member}",
        f"{PREFIX}usage:{entry.day}",
        spend_key(entry.month, key_subject(entry.key_id)),
        spend_key(entry.month, team_subject(entry.team)),
    ]
    usage = entry.usage
    args: list[str | float] = [
        SEEN_SECONDS,
        member,
        entry.team,
        entry.key_prefix,
        RETENTION_SECONDS,
        usage.cost,
        usage.tokens,
    ]
    for name, value in usage.counters().items():
        if value:
            args += [name, value]
    return keys, args


_COLUMNS = ", ".join(f"{name} REAL NOT NULL DEFAULT 0" for name in COUNTERS)
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS usage (
    day TEXT NOT NULL, key_id TEXT NOT NULL, model TEXT NOT NULL, team TEXT NOT NULL, key_prefix TEXT NOT NULL,
    {_COLUMNS}, PRIMARY KEY (day, key_id, model)
);
CREATE TABLE IF NOT EXISTS usage_seen (request_id TEXT PRIMARY KEY, day TEXT NOT NULL);
"""
_UPSERT = (
    f"INSERT INTO usage (day, key_id, model, team, key_prefix, {', '.join(COUNTERS)}) "
    f"VALUES (?, ?, ?, ?, ?, {', '.join('?' for _ in COUNTERS)}) "
    "ON CONFLICT (day, key_id, model) DO UPDATE SET team = excluded.team, key_prefix = excluded.key_prefix, "
    + ", ".join(f"{name} = {name} + excluded.{name}" for name in COUNTERS)
)


def add_new_counters(db: sqlite3.Connection) -> None:
    """The columns of counters added since the file was made (e.g. the rerank counters of 0.3), at 0."""
    present = {row[1] for row in db.execute("PRAGMA table_info(usage)")}
    for name in COUNTERS:
        if name not in present:
            db.execute(f"ALTER TABLE usage ADD COLUMN {name} REAL NOT NULL DEFAULT 0")


class SqliteUsageStore:
    """The same in an SQLite file. Its statements run on one worker thread of its own, in order: a batch's
    transaction, a WAL checkpoint or a month's report can take long enough to stall every request if run on
    the event loop, and one thread keeps the connection's transactions from interleaving."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._db: sqlite3.Connection | None = None
        self._purged_day = ""
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="usage-sqlite")
        self._closed = False

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, call, *args)

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            Path(self._path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            add_new_counters(self._db)
        return self._db

    async def add_many(self, entries: Sequence[UsageEntry]) -> list[bool]:
        """The batch in one transaction."""
        if not entries:
            return []
        return await self._run(self._add_many, list(entries))

    def _add_many(self, entries: list[UsageEntry]) -> list[bool]:
        """The new records summed per row before they are written: one upsert per key x model x day of the
        batch (and team and prefix: a row takes those of its last record), not one per request."""
        db = self._connection()
        added = []
        sums: dict[tuple[str, str, str, str, str], list[float]] = {}
        with db:
            db.execute("BEGIN IMMEDIATE")
            for entry in entries:
                new = not entry.id_may_repeat or (
                    db.execute("INSERT OR IGNORE INTO usage_seen VALUES (?, ?)", (entry.request_id, entry.day)).rowcount
                    == 1
                )
                added.append(new)
                if new:
                    row = (entry.day, entry.key_id, entry.model, entry.team, entry.key_prefix)
                    counters = entry.usage.counters()
                    before = sums.pop(row, None)  # popped and put back: the rows stay in the order of their last record
                    values = [counters[name] for name in COUNTERS]
                    sums[row] = values if before is None else [a + b for a, b in zip(before, values, strict=True)]
            db.executemany(_UPSERT, [(*row, *values) for row, values in sums.items()])
            day = entries[-1].day
            if day != self._purged_day:  # once a day: ids older than any retry of their write go
                oldest = (date.fromisoformat(day) - timedelta(seconds=SEEN_SECONDS)).isoformat()
                db.execute("DELETE FROM usage_seen WHERE day < ?", (oldest,))
                self._purged_day = day
        return added

    async def rows(self, start: date, end: date) -> list[UsageRow]:
        return await self._run(self._rows, start, end)

    def _rows(self, start: date, end: date) -> list[UsageRow]:
        query = f"SELECT day, key_id, key_prefix, team, model, {', '.join(COUNTERS)} FROM usage "
        query += "WHERE day BETWEEN ? AND ? ORDER BY day, key_id, model"
        return [
            UsageRow(row[0], row[1], row[2], row[3], row[4], dict(zip(COUNTERS, row[5:], strict=True)))
            for row in self._connection().execute(query, (start.isoformat(), end.isoformat()))
        ]

    async def month_spend(self, month: str) -> dict[str, tuple[float, int]]:
        """Cost and tokens per subject (`key:<id>`, `team:<name>`) this month: the budgets after a restart."""
        return await self._run(self._month_spend, month)

    def _month_spend(self, month: str) -> dict[str, tuple[float, int]]:
        query = "SELECT key_id, team, SUM(cost), SUM(prompt_tokens + completion_tokens + embedding_tokens) "
        query += "FROM usage WHERE day LIKE ? GROUP BY key_id, team"
        spend: dict[str, tuple[float, int]] = {}
        for key_id, team, cost, tokens in self._connection().execute(query, (f"{month}-%",)):
            for subject in (key_subject(key_id), team_subject(team)):
                before = spend.get(subject, (0.0, 0))
                spend[subject] = (before[0] + cost, before[1] + int(tokens))
        return spend

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._run(self._close)
        self._thread.shutdown(wait=True)

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def build_usage_store(redis: RedisConnection | None, sqlite_path: str) -> UsageStore:
    if redis is not None:
        return RedisUsageStore(redis)
    return SqliteUsageStore(sqlite_path)
