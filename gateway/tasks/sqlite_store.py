"""`TaskStore` on an SQLite file: the embedded default, for one gateway process.

Layout: table `tasks` (id, state, version, idempotency_key UNIQUE, expires_at, due_at = `Task.due_at`, record =
`Task.to_json()`; unfinished tasks indexed by due_at) and table `leases` (name, owner, expires_at on the store's
clock). A file from before due_at gets the column on open, 0 for every row: each is due once, then indexed.

The connection runs in autocommit mode: every statement is its own transaction, committed to the WAL before
the call returns, so a process killed right after a write loses nothing and the next process on the same
file sees it. Each check-and-write is a single statement (`INSERT … ON CONFLICT`, `UPDATE … WHERE version =
?`), or for a write and the lease that comes with it (a new task and its submit lease, a submitted task and
its job's claim), one explicit transaction run without a pause, so callers never interleave inside a transaction.
WAL with synchronous=NORMAL: a crashed process loses nothing, a power loss may lose the last commits.

Statements run on the event loop. Each reads or writes a few rows through an index and appends to the WAL
in the page cache, which takes microseconds (writes the most: a commit appends every page it changed). A
worker thread (aiosqlite) costs more CPU per statement than that, and under load its waits for the GIL
turned a quick insert into a slow tail. Nothing on the loop waits for anything else: a locked database (another
process writing, a checkpoint) is tried again after a short asynchronous pause (busy timeout 0 on the
connection), checkpoints (copying the WAL back, with fsync) run in a worker thread on their own connection
every CHECKPOINT_EVERY_WRITES writes (SQLite's own would run on the writer: the loop), so does the count of
open tasks (it reads every one), and expired tasks are deleted in batches.

Watchers are woken in process only (`ChangeNotifier`); another process on the same file sees the data, and
its watchers notice a change on their own timeout.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, closing, contextmanager
from pathlib import Path
from typing import Any, TypeVar

from gateway.tasks.base import ChangeNotifier, Lease, TaskChanges, TaskStoreError
from gateway.tasks.model import OPEN_STATES, Task, TaskState

log = logging.getLogger(__name__)
T = TypeVar("T")
_jitter = random.Random()  # not the global generator, whose state belongs to the host program (and its tests)

CHECKPOINT_EVERY_WRITES = 250  # keeps the WAL near the size at which SQLite's own checkpoint (1,000 pages) runs
PURGE_BATCH = 500
LOCKED_PAUSES = (0.0005, 0.02)  # seconds between tries while the database is locked: the first, the longest

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    version INTEGER NOT NULL,
    idempotency_key TEXT UNIQUE,
    expires_at REAL,
    due_at REAL NOT NULL DEFAULT 0,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS leases (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at REAL NOT NULL);
"""
# Literal states, not parameters: SQLite uses a partial index only when the query's WHERE visibly implies its own.
_IS_OPEN = f"state IN ({', '.join(repr(state.value) for state in OPEN_STATES)})"
_INDEXES = f"""
CREATE INDEX IF NOT EXISTS tasks_by_state ON tasks (state);
CREATE INDEX IF NOT EXISTS tasks_by_expiry ON tasks (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS tasks_due ON tasks (due_at) WHERE {_IS_OPEN};
"""

_INSERT = (
    "INSERT INTO tasks (id, state, version, idempotency_key, expires_at, due_at, record) "
    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
# The task holding the key, else one stored under the same id (a create retried after a lost answer).
_HOLDER = "SELECT record FROM tasks WHERE idempotency_key = ? OR id = ? ORDER BY idempotency_key IS ? DESC LIMIT 1"
_UPDATE = (
    "UPDATE tasks SET state = ?, version = ?, expires_at = ?, due_at = ?, record = ? "
    f"WHERE id = ? AND version = ? AND {_IS_OPEN}"
)
# INDEXED BY: without statistics the planner took tasks_by_state and sorted every open task, a cost that
# grows with the open tasks; the due index reads only the rows due, already in order.
_DUE = f"SELECT record FROM tasks INDEXED BY tasks_due WHERE {_IS_OPEN} AND due_at <= ? ORDER BY due_at, rowid LIMIT ?"
_COUNT_OPEN = f"SELECT state, COUNT(*) FROM tasks WHERE {_IS_OPEN} GROUP BY state"
_PURGE = "DELETE FROM tasks WHERE rowid IN (SELECT rowid FROM tasks WHERE expires_at < ? LIMIT ?)"
_PURGE_LEASES = "DELETE FROM leases WHERE expires_at < ?"
_ACQUIRE = (
    "INSERT INTO leases (name, owner, expires_at) VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE "
    "SET owner = excluded.owner, expires_at = excluded.expires_at "
    "WHERE leases.owner = excluded.owner OR leases.expires_at <= ?"
)


class SqliteTaskStore:
    """Tasks in one SQLite file; the file (and its directory) is created on first use."""

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout_seconds: float = 5.0,
    ) -> None:
        self.path = Path(path)
        self._clock = clock
        self._busy_timeout_seconds = busy_timeout_seconds
        self._db: sqlite3.Connection | None = None
        self._opening = asyncio.Lock()
        self._notifier = ChangeNotifier()
        self._writes = 0  # since the last checkpoint
        self._checkpointing: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"

    async def open(self) -> None:
        """Open the file now (a bad path fails at startup rather than on the first request)."""
        await self._connection()

    async def aclose(self) -> None:
        checkpointing, self._checkpointing = self._checkpointing, None
        if checkpointing is not None:
            await checkpointing
        db, self._db = self._db, None
        if db is not None:
            with self._translated("close"):
                db.close()

    async def create(self, task: Task, lease: Lease | None = None) -> tuple[Task, bool]:
        key = task.idempotency_key
        row = (task.id, task.state.value, task.version, key, task.expires_at, task.due_at, task.to_json())
        for _ in range(3):  # the key's holder may expire and be deleted between our two statements
            if key is not None:  # an expired holder no longer holds the key
                await self._write(
                    "create", "DELETE FROM tasks WHERE idempotency_key = ? AND expires_at < ?", (key, self._clock())
                )
            if await self._insert(row, lease):
                return task, True
            records = await self._read("create", _HOLDER, (key, task.id, key))
            if records:
                return _decode(records[0]), False
        raise TaskStoreError(f"sqlite create of task {task.id}: its idempotency key is held by a vanishing task")

    async def get(self, task_id: str) -> Task | None:
        sql = "SELECT record FROM tasks WHERE id = ? AND (expires_at IS NULL OR expires_at >= ?)"
        records = await self._read("get", sql, (task_id, self._clock()))
        return _decode(records[0]) if records else None

    async def save(self, task: Task, lease: Lease | None = None) -> bool:
        values = (task.state.value, task.version, task.expires_at, task.due_at, task.to_json(), task.id)
        if not await self._update((*values, task.version - 1), lease):
            return False
        self._notifier.notify(task.id)
        return True

    async def due(self, now: float, limit: int | None = None) -> list[Task]:
        records = await self._read("due", _DUE, (now, -1 if limit is None else limit))
        return [_decode(record) for record in records]

    async def count_unfinished(self) -> dict[TaskState, int]:
        """Counted off the loop (see the module docstring)."""
        await self._connection()  # the file and its schema exist
        with self._translated("count_unfinished"):
            rows = await self._on_own_connection(lambda db: db.execute(_COUNT_OPEN).fetchall())
        return {TaskState(str(state)): int(count) for state, count in rows}

    async def acquire_lease(self, name: str, owner: str, ttl_seconds: float) -> bool:
        now = self._clock()
        return await self._write("acquire_lease", _ACQUIRE, (name, owner, now + ttl_seconds, now)) == 1

    async def release_lease(self, name: str, owner: str) -> None:
        await self._write("release_lease", "DELETE FROM leases WHERE name = ? AND owner = ?", (name, owner))

    def changes(self, task_id: str) -> AbstractAsyncContextManager[TaskChanges]:
        return self._notifier.subscribe(task_id)

    async def purge_expired(self, now: float) -> int:
        """In batches, so one large delete never holds the loop. Expired leases go too: a lease on a task that
        has moved on is left to lapse rather than released (see `VideoSubmitter`)."""
        await self._write("purge_expired", _PURGE_LEASES, (now,))
        purged = 0
        while True:
            batch = await self._write("purge_expired", _PURGE, (now, PURGE_BATCH))
            purged += batch
            if batch < PURGE_BATCH:
                return purged
            await asyncio.sleep(0)

    async def ping(self) -> bool:
        try:
            return await self._read("ping", "SELECT 1", ()) == ["1"]
        except TaskStoreError:
            return False

    async def _insert(self, row: Sequence[object], lease: Lease | None) -> int:
        """`_INSERT` of `row`, and when it inserts, `lease` taken in the same transaction."""
        return await self._with_lease("create", _INSERT, row, lease)

    async def _update(self, values: Sequence[object], lease: Lease | None) -> int:
        """`_UPDATE` with `values`, and when it sticks, `lease` taken in the same transaction (one commit, not
        two: a commit appends every page it changed to the WAL, the costly part of a write)."""
        if lease is None:
            return await self._write("save", _UPDATE, values)
        return await self._with_lease("save", _UPDATE, values, lease)

    async def _with_lease(self, operation: str, sql: str, parameters: Sequence[object], lease: Lease | None) -> int:
        """`sql`, and when it changes a row, `lease` taken (as `acquire_lease` takes it), in one transaction
        (BEGIN IMMEDIATE: the write lock first, so a locked file fails before anything is written and
        `_while_locked` tries again); the rows `sql` changed."""
        now = self._clock()

        def write(db: sqlite3.Connection) -> int:
            db.execute("BEGIN IMMEDIATE")
            try:
                changed = db.execute(sql, parameters).rowcount
                if changed and lease is not None:
                    db.execute(_ACQUIRE, (lease.name, lease.owner, now + lease.ttl_seconds, now))
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return int(changed)

        return await self._committed(operation, write)

    async def _write(self, operation: str, sql: str, parameters: Sequence[object]) -> int:
        """Run one statement (its own committed transaction); the number of rows it changed."""
        return await self._committed(operation, lambda db: db.execute(sql, parameters).rowcount)

    async def _committed(self, operation: str, write: Callable[[sqlite3.Connection], int]) -> int:
        """Run `write`, which commits, and checkpoint every CHECKPOINT_EVERY_WRITES writes."""
        changed = await self._run(operation, write)
        self._writes += 1
        if self._writes >= CHECKPOINT_EVERY_WRITES and self._checkpointing is None:
            self._writes = 0
            self._checkpointing = asyncio.get_running_loop().create_task(self._checkpoint())
        return int(changed)

    async def _read(self, operation: str, sql: str, parameters: Sequence[object]) -> list[str]:
        """The first column of every row, as text."""
        return [str(row[0]) for row in await self._rows(operation, sql, parameters)]

    async def _rows(self, operation: str, sql: str, parameters: Sequence[object] = ()) -> list[Any]:
        return await self._run(operation, lambda db: db.execute(sql, parameters).fetchall())

    async def _run(self, operation: str, statement: Callable[[sqlite3.Connection], T]) -> T:
        db = await self._connection()
        with self._translated(operation):
            return await self._while_locked(lambda: statement(db))

    async def _while_locked(self, attempt: Callable[[], T]) -> T:
        """`attempt()`, tried again after a pause while the database is locked (a checkpoint, another process
        writing, replicas setting up one new file), until the busy timeout."""
        deadline = time.monotonic() + self._busy_timeout_seconds
        pause, longest = LOCKED_PAUSES
        while True:
            try:
                return attempt()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(pause * _jitter.uniform(0.5, 1.5))  # jittered: replicas do not retry in step
            pause = min(2 * pause, longest)

    async def _checkpoint(self) -> None:
        """Copy the WAL back into the database file, in a worker thread: first PASSIVE, the bulk, while writers
        go on; then RESTART, which copies what they appended meanwhile holding new writes off (a write waits
        for it in `_while_locked`, briefly), so the next write starts the WAL over."""

        def checkpoint(db: sqlite3.Connection) -> None:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            db.execute("PRAGMA wal_checkpoint(RESTART)")

        try:
            await self._on_own_connection(checkpoint)
        except (sqlite3.Error, OSError) as exc:  # the WAL grows until the next one
            log.warning("sqlite checkpoint of %s failed: %s: %s", self.path, type(exc).__name__, exc)
        finally:
            self._checkpointing = None

    async def _on_own_connection(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work` in a worker thread on a connection of its own (SQLite's busy handler may sleep there)."""

        def call() -> T:
            with closing(sqlite3.connect(self.path, timeout=self._busy_timeout_seconds)) as db:
                return work(db)

        return await asyncio.to_thread(call)

    async def _connection(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        async with self._opening:
            if self._db is None:
                with self._translated("open"):
                    self._db = await self._connect()
        return self._db

    async def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit (see the module docstring); busy timeout 0: `_while_locked` waits for locks, not SQLite's
        # busy handler, which would sleep on the loop.
        db = sqlite3.connect(self.path, isolation_level=None, timeout=0)
        try:
            # Every set-up step is idempotent, so the whole set-up is tried again while another replica
            # opening the same new file holds it (switching to WAL, creating the schema).
            await self._while_locked(lambda: self._set_up(db))
        except BaseException:
            db.close()
            raise
        return db

    @staticmethod
    def _set_up(db: sqlite3.Connection) -> None:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA wal_autocheckpoint = 0")  # `_checkpoint` does it, off the loop
        db.executescript(_SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(tasks)")}
        if "due_at" not in columns:  # a file from before the due index
            try:
                db.execute("ALTER TABLE tasks ADD COLUMN due_at REAL NOT NULL DEFAULT 0")
            except sqlite3.OperationalError as exc:  # another replica added it meanwhile
                if "duplicate column" not in str(exc):
                    raise
        db.executescript(_INDEXES)

    @contextmanager
    def _translated(self, operation: str) -> Iterator[None]:
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            detail = f"{self.path}: {type(exc).__name__}: {exc}"
            raise TaskStoreError(f"sqlite {operation} failed", detail=detail) from exc


def _decode(record: str) -> Task:
    try:
        return Task.from_json(record)
    except (ValueError, TypeError, KeyError) as exc:
        raise TaskStoreError("sqlite task record is malformed", detail=f"{type(exc).__name__}: {exc}") from exc
