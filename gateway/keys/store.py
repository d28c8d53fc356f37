"""Where the admin API keeps keys and team limits: Redis (shared by every replica) or SQLite (one process).

Both keep a version that every write changes, so a replica polls one cheap value and reloads everything only
when it changed (`KeyResolver`). Records never hold a secret, only its SHA-256.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gateway.errors import UpstreamUnavailableError
from gateway.keys.model import ApiKey, KeyLimits
from gateway.keys.names import PREFIX
from gateway.redis_client import OUTAGES, REDIS_FAILURES, RedisConnection


@dataclass(frozen=True)
class StoredKeys:
    keys: list[ApiKey]
    teams: dict[str, KeyLimits]
    version: str


class KeyStoreUnavailableError(UpstreamUnavailableError):
    """The key store (Redis) failed a read or a write: the admin API call answers 503, while every replica
    goes on checking keys against the copy it loaded last.

    Do: admin: retry when Redis is back; operator: Redis's health (`gateway_redis_call_failures_total`).
    """


class KeyStoreOutageError(KeyStoreUnavailableError):
    """As `KeyStoreUnavailableError`, when Redis does not answer at all or its circuit is open.

    Do: admin: retry when Redis is back; operator: restore Redis (`gateway_redis_circuit_open`).

    The Redis circuit has logged the outage already, so the key poll logs this one only at DEBUG.
    """


class KeyStore(Protocol):
    async def version(self) -> str: ...

    async def load(self) -> StoredKeys: ...

    async def put_key(self, key: ApiKey) -> None: ...

    async def put_team(self, team: str, limits: KeyLimits) -> None: ...

    async def aclose(self) -> None: ...


class RedisKeyStore:
    """Hashes `<prefix>records` (id -> record JSON) and `<prefix>teams`, and `<prefix>version` (random per write).
    Calls go through the circuit of `redis` (the process's shared `RedisConnection`, or a URL for one of its
    own): while it is open they fail at once, and the resolver keeps the keys it holds."""

    def __init__(self, redis: str | RedisConnection, timeout_seconds: float = 0.25, prefix: str = PREFIX) -> None:
        self._redis = RedisConnection.shared(redis, timeout_seconds=timeout_seconds)
        self._client = self._redis.client
        self._records, self._teams, self._version = prefix + "records", prefix + "teams", prefix + "version"

    def __repr__(self) -> str:
        return "RedisKeyStore()"  # no URL: it may hold a password

    async def version(self) -> str:
        try:
            value = await self._redis.call(lambda: self._client.get(self._version))
        except REDIS_FAILURES as exc:
            raise _unavailable(exc) from None
        return _text(value)

    async def load(self) -> StoredKeys:
        try:
            version, records, teams = await self._redis.call(self._read_all)
        except REDIS_FAILURES as exc:
            raise _unavailable(exc) from None
        return StoredKeys(
            [ApiKey.from_record(json.loads(raw)) for raw in records.values()],
            {name.decode(): KeyLimits.model_validate_json(raw) for name, raw in teams.items()},
            _text(version),
        )

    async def _read_all(self) -> list[Any]:
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.get(self._version)
            pipe.hgetall(self._records)
            pipe.hgetall(self._teams)
            return await pipe.execute()

    async def put_key(self, key: ApiKey) -> None:
        await self._write(self._records, key.id, json.dumps(key.to_record()))

    async def put_team(self, team: str, limits: KeyLimits) -> None:
        await self._write(self._teams, team, limits.model_dump_json(exclude_none=True))

    async def _write(self, hash_name: str, field: str, value: str) -> None:
        async def write() -> None:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.hset(hash_name, field, value)
                # A new random version, not a counter: after Redis loses its data a counter would repeat a
                # value the replicas already hold, and they would not reload.
                pipe.set(self._version, uuid.uuid4().hex)
                await pipe.execute()

        try:
            await self._redis.call(write)
        except REDIS_FAILURES as exc:
            raise _unavailable(exc) from None

    async def aclose(self) -> None:
        await self._redis.aclose()


def _unavailable(exc: BaseException) -> KeyStoreUnavailableError:
    error = KeyStoreOutageError if isinstance(exc, OUTAGES) else KeyStoreUnavailableError
    return error("key store (Redis) unreachable", detail=str(exc))


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else value or ""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (id TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS team_limits (team TEXT PRIMARY KEY, limits TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS key_store_version (one INTEGER PRIMARY KEY CHECK (one = 1), version INTEGER NOT NULL);
INSERT OR IGNORE INTO key_store_version VALUES (1, 0);
"""


class SqliteKeyStore:
    """The same on an SQLite file. Statements run on the event loop: each touches a few rows of a small table,
    and admin writes are rare (the task store's module explains why a worker thread would cost more)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._db: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            Path(self._path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
        return self._db

    async def version(self) -> str:
        row = self._connection().execute("SELECT version FROM key_store_version").fetchone()
        return str(row[0])

    async def load(self) -> StoredKeys:
        db = self._connection()
        keys = [ApiKey.from_record(json.loads(r)) for (r,) in db.execute("SELECT record FROM api_keys")]
        teams = {t: KeyLimits.model_validate_json(limits) for t, limits in db.execute("SELECT * FROM team_limits")}
        return StoredKeys(keys, teams, await self.version())

    async def put_key(self, key: ApiKey) -> None:
        self._write("INSERT OR REPLACE INTO api_keys VALUES (?, ?)", (key.id, json.dumps(key.to_record())))

    async def put_team(self, team: str, limits: KeyLimits) -> None:
        self._write(
            "INSERT OR REPLACE INTO team_limits VALUES (?, ?)", (team, limits.model_dump_json(exclude_none=True))
        )

    def _write(self, statement: str, values: tuple[str, str]) -> None:
        db = self._connection()
        with db:  # one transaction: the row and the version together
            db.execute("BEGIN IMMEDIATE")
            db.execute(statement, values)
            db.execute("UPDATE key_store_version SET version = version + 1")

    async def aclose(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def build_key_store(redis: RedisConnection | None, sqlite_path: str) -> KeyStore:
    """Redis when configured (shared by every replica), else SQLite at `sqlite_path` (one process)."""
    if redis is not None:
        return RedisKeyStore(redis)
    return SqliteKeyStore(sqlite_path)
