"""`UsageSpool`: usage records Redis did not take (an error, a timeout, its open circuit), kept in a small local
SQLite file until the recorder replays them to Redis (the record script counts each request id once, so a record
replayed twice, or one whose replay was cut off before its removal here, still counts once).

WAL with synchronous=NORMAL: a committed record survives a killed process (not a power loss of the host). The
file is bounded (`max_records`): past it, new records are dropped and counted. Every call runs in a worker
thread, one batch of records per call, so the event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from gateway.usage.record import Usage
from gateway.usage.store import UsageEntry

SPOOL_FAILURES = (sqlite3.Error, OSError)
_SCHEMA = "CREATE TABLE IF NOT EXISTS spool (id INTEGER PRIMARY KEY AUTOINCREMENT, entry TEXT NOT NULL)"


class UsageSpool:
    def __init__(self, path: str, max_records: int) -> None:
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        self.path = path
        self.max_records = max_records
        self._db: sqlite3.Connection | None = None
        self._count = 0  # records in the file, kept here so that a put needs no COUNT(*)
        self._lock = threading.Lock()  # one statement at a time on the one connection

    def __repr__(self) -> str:
        return f"UsageSpool(path={self.path!r}, max_records={self.max_records})"

    async def put(self, entries: Sequence[UsageEntry]) -> int:
        """Keep `entries` (as many as the bound leaves room for); returns how many were dropped."""
        return await asyncio.to_thread(self._put, list(entries))

    async def take(self, limit: int) -> list[tuple[int, UsageEntry]]:
        """Up to `limit` of the oldest records with their ids; they stay until `remove`."""
        return await asyncio.to_thread(self._take, limit)

    async def remove(self, ids: Sequence[int]) -> None:
        await asyncio.to_thread(self._remove, list(ids))

    async def size(self) -> int:
        """Records in the file (those a killed process left included)."""
        return await asyncio.to_thread(self._size)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._close)

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(_SCHEMA)
            self._count = int(db.execute("SELECT COUNT(*) FROM spool").fetchone()[0])
            self._db = db
        return self._db

    def _put(self, entries: list[UsageEntry]) -> int:
        with self._lock:
            db = self._connection()
            kept = entries[: max(0, self.max_records - self._count)]
            if kept:
                with db:
                    db.execute("BEGIN IMMEDIATE")
                    db.executemany("INSERT INTO spool (entry) VALUES (?)", [(_dumps(entry),) for entry in kept])
                self._count += len(kept)
            return len(entries) - len(kept)

    def _take(self, limit: int) -> list[tuple[int, UsageEntry]]:
        with self._lock:
            rows = self._connection().execute("SELECT id, entry FROM spool ORDER BY id LIMIT ?", (limit,))
            return [(int(row_id), _loads(text)) for row_id, text in rows.fetchall()]

    def _remove(self, ids: list[int]) -> None:
        with self._lock:
            db = self._connection()
            with db:
                db.execute("BEGIN IMMEDIATE")
                removed = db.executemany("DELETE FROM spool WHERE id = ?", [(row_id,) for row_id in ids]).rowcount
            self._count = max(0, self._count - removed)

    def _size(self) -> int:
        with self._lock:
            self._connection()
            return self._count

    def _close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def _dumps(entry: UsageEntry) -> str:
    return json.dumps(asdict(entry), separators=(",", ":"))


def _loads(text: str) -> UsageEntry:
    fields = json.loads(text)
    usage = Usage(**fields.pop("usage"))
    return UsageEntry(**fields, usage=usage)
