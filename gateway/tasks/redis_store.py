"""`TaskStore` on Redis, shared by every gateway replica.

Keys (prefix `gateway:tasks:` by default):

    {prefix}task:{id}      hash: version, state, expires_at, record (`Task.to_json()`)
    {prefix}idem:{key}     string: the id of the task holding the idempotency key
    {prefix}due:{state}    sorted set per unfinished state (pending, processing): task ids by `Task.due_at`
    {prefix}lease:{name}   string: the owner, with a PX expiry (on Redis' clock)
    {prefix}changed        pub/sub channel: '{origin} {id}' for each saved task (origin: the saving store)

Check-and-write steps are Lua scripts, so they are atomic across replicas: `create` (take the idempotency key
or return its holder; a new task's lease, if one comes with it), `save` (compare-and-set on `version`, never over
a terminal state, then PUBLISH; a lease that comes with the write is taken as the acquire script takes it) and the
lease scripts (only the owner renews or releases). The create script derives the holder's key from the prefix, so
on a Redis Cluster the prefix needs a hash tag (`gateway:{tasks}:`).

Records expire by TTL: `unfinished_ttl_seconds` as a safety net while a task runs, then the task's
`expires_at` once it ends (on the task key and its idempotency key). Expiry is also checked against the
store's clock on read, so a task past `expires_at` is gone at once, as in SQLite.

Watchers: one pub/sub connection per store (taken from the client's pool for good), opened with the first
watcher, feeds the in-process notifier; it reconnects with back-off when Redis drops it and then wakes every
watcher, since changes may have been missed meanwhile.

Tasks are durable data: every Redis failure raises `TaskStoreError` (503) at once and nothing is written, so a
task is never lost, only unavailable. Calls go through the circuit of the store's `RedisConnection` (the
process's shared one, or one of its own for a URL): while it is open after a timeout, calls fail at once
instead of each waiting out the timeout. The URL may hold a password: it is never put into messages or logs.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, TypeVar

from gateway.background import cancel_and_wait
from gateway.redis_client import REDIS_FAILURES, RedisConnection
from gateway.tasks.base import ChangeNotifier, Lease, TaskChanges, TaskStoreError
from gateway.tasks.model import OPEN_STATES, TERMINAL_STATES, Task, TaskState

log = logging.getLogger(__name__)
T = TypeVar("T")

MIN_TERMINAL_TTL_MS = 1000  # an ended task stays readable long enough for its watchers to see the outcome
RECONNECT_DELAYS = (0.05, 2.0)  # first and longest pause between pub/sub reconnection attempts, seconds


class RedisTaskStore:
    """Tasks in Redis; every replica pointed at the same Redis and prefix shares them."""

    def __init__(
        self,
        redis: str | RedisConnection,
        *,
        timeout_seconds: float = 1.0,
        key_prefix: str = "gateway:tasks:",
        unfinished_ttl_seconds: float = 7 * 24 * 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = RedisConnection.shared(redis, timeout_seconds=timeout_seconds)
        self._client = self._redis.client
        self._timeout_seconds = self._redis.timeout_seconds
        self._prefix = key_prefix
        self._due = [key_prefix + "due:" + state.value for state in OPEN_STATES]
        self._channel = key_prefix + "changed"
        self._unfinished_ttl_ms = max(1, round(unfinished_ttl_seconds * 1000))
        self._clock = clock
        self._create = self._client.register_script(_CREATE_LUA)
        self._save = self._client.register_script(_SAVE_LUA)
        self._acquire = self._client.register_script(_ACQUIRE_LUA)
        self._release = self._client.register_script(_RELEASE_LUA)
        self._notifier = ChangeNotifier()
        self._origin = uuid.uuid4().hex  # marks this store's announcements, already delivered in process
        self._watched: Counter[str] = Counter()
        self._listener: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()  # set while the pub/sub connection is subscribed

    def __repr__(self) -> str:
        return f"{type(self).__name__}(key_prefix={self._prefix!r})"  # no URL: it may hold a password

    async def aclose(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            await cancel_and_wait(listener, name="task change listener")
        await self._redis.aclose()

    async def create(self, task: Task, lease: Lease | None = None) -> tuple[Task, bool]:
        keys = self._keys(task)
        args: list[str | int] = [task.id, task.version, task.state.value, _number(task.expires_at), task.to_json()]
        args += [int(task.state.terminal), self._ttl_ms(task), self._prefix, repr(self._clock()), repr(task.due_at)]
        if lease is not None:
            keys.append(self._lease_key(lease.name))
            args += [lease.owner, _ttl_ms(lease.ttl_seconds)]
        reply = await self._call("create", lambda: self._create(keys=keys, args=args))
        return (task, True) if reply == 1 else (_decode(reply), False)

    async def get(self, task_id: str) -> Task | None:
        record = await self._call("get", lambda: self._client.hget(self._task_key(task_id), "record"))
        task = None if record is None else _decode(record)
        return None if task is None or self._expired(task) else task

    async def save(self, task: Task, lease: Lease | None = None) -> bool:
        keys = self._keys(task)
        args: list[str | int] = [task.id, task.version - 1, task.version, task.state.value, _number(task.expires_at)]
        args += [task.to_json(), int(task.state.terminal), self._ttl_ms(task), self._channel, self._origin]
        args.append(repr(task.due_at))
        if lease is not None:
            keys.append(self._lease_key(lease.name))
            args += [lease.owner, _ttl_ms(lease.ttl_seconds)]
        if not await self._call("save", lambda: self._save(keys=keys, args=args)):
            return False
        self._notifier.notify(task.id)  # watchers here need not wait for the round trip through Redis
        return True

    async def due(self, now: float, limit: int | None = None) -> list[Task]:
        """Each state's due ids (at most `limit` each), then the earliest `limit` of their records; ids whose
        record has gone (expired by the safety TTL, flushed) are taken out of the index."""
        bound = "+inf" if now == math.inf else repr(now)
        start, num = (None, None) if limit is None else (0, limit)

        async def ranges() -> list[list[tuple[bytes, float]]]:
            async with self._client.pipeline(transaction=False) as pipe:
                for key in self._due:
                    pipe.zrangebyscore(key, "-inf", bound, start=start, num=num, withscores=True)
                return list(await pipe.execute())

        due = sorted((score, _text(member)) for found in await self._call("due", ranges) for member, score in found)
        ids = [task_id for _, task_id in due[:limit]]
        if not ids:
            return []
        records = await self._call("due", lambda: self._records(ids))
        stale = [task_id for task_id, record in zip(ids, records, strict=True) if record is None]
        if stale:
            await self._call("due", lambda: self._forget(stale))
        tasks = [_decode(record) for record in records if record is not None]
        return [task for task in tasks if not task.state.terminal]

    async def count_unfinished(self) -> dict[TaskState, int]:
        async def cards() -> list[int]:
            async with self._client.pipeline(transaction=False) as pipe:
                for key in self._due:
                    pipe.zcard(key)
                return list(await pipe.execute())

        return dict(zip(OPEN_STATES, await self._call("count_unfinished", cards), strict=True))

    async def acquire_lease(self, name: str, owner: str, ttl_seconds: float) -> bool:
        keys, args = [self._lease_key(name)], [owner, _ttl_ms(ttl_seconds)]
        return bool(await self._call("acquire_lease", lambda: self._acquire(keys=keys, args=args)))

    async def release_lease(self, name: str, owner: str) -> None:
        keys = [self._lease_key(name)]
        await self._call("release_lease", lambda: self._release(keys=keys, args=[owner]))

    @asynccontextmanager
    async def changes(self, task_id: str) -> AsyncIterator[TaskChanges]:
        """Subscribed once this is entered (if Redis answers in time): no later change elsewhere is missed."""
        if self._listener is None or self._listener.done():
            self._listener = asyncio.ensure_future(self._listen())
        self._watched[task_id] += 1
        try:
            async with self._notifier.subscribe(task_id) as changes:
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._listening.wait(), self._timeout_seconds)
                yield changes
        finally:
            self._watched[task_id] -= 1
            if not self._watched[task_id]:
                del self._watched[task_id]

    async def purge_expired(self, now: float) -> int:
        """Redis drops ended tasks by TTL (`due` forgets the ids of vanished unfinished ones)."""
        return 0

    async def ping(self) -> bool:
        """Whether Redis answered last time; never waits on it (readiness reads this)."""
        return self._redis.known_up()

    async def _records(self, ids: list[str]) -> list[bytes | None]:
        async with self._client.pipeline(transaction=False) as pipe:
            for task_id in ids:
                pipe.hget(self._task_key(task_id), "record")
            return list(await pipe.execute())

    async def _listen(self) -> None:
        """Feed the notifier from the `changed` channel for the store's lifetime, reconnecting as needed."""
        delay, reconnecting = RECONNECT_DELAYS[0], False
        while True:
            pubsub = self._client.pubsub(ignore_subscribe_messages=False)
            try:
                await pubsub.subscribe(self._channel)
                while True:
                    message = await pubsub.get_message(timeout=5.0)  # a pause lets redis-py send health checks
                    if message is None:
                        continue
                    if message["type"] == "subscribe":  # also after redis-py reconnected on its own
                        delay = RECONNECT_DELAYS[0]
                        self._subscribed(reconnecting)
                        reconnecting = True
                    elif message["type"] == "message":
                        origin, _, task_id = _text(message["data"]).partition(" ")
                        if origin != self._origin:
                            self._notifier.notify(task_id)
            except REDIS_FAILURES as exc:
                level = logging.WARNING if delay == RECONNECT_DELAYS[0] else logging.DEBUG  # once per outage
                log.log(level, "task change feed lost (%s: %s); reconnecting with back-off", type(exc).__name__, exc)
            except Exception:  # the feed must outlive a surprise; watchers fall back to re-reading meanwhile
                log.exception("task change feed failed; reconnecting in %.2f s", delay)
            finally:
                self._listening.clear()
                await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_DELAYS[1])

    def _subscribed(self, after_outage: bool) -> None:
        self._listening.set()
        if after_outage:  # changes published while disconnected were lost: every watcher re-reads
            for task_id in list(self._watched):
                self._notifier.notify(task_id)

    async def _call(self, operation: str, command: Callable[[], Awaitable[T]]) -> T:
        try:
            return await self._redis.call(command)
        except REDIS_FAILURES as exc:
            raise TaskStoreError(f"redis {operation} failed", detail=f"{type(exc).__name__}: {exc}") from exc

    def _task_key(self, task_id: str) -> str:
        return self._prefix + "task:" + task_id

    def _lease_key(self, name: str) -> str:
        return self._prefix + "lease:" + name

    async def _forget(self, ids: list[str]) -> None:
        async with self._client.pipeline(transaction=False) as pipe:
            for key in self._due:
                pipe.zrem(key, *ids)
            await pipe.execute()

    def _keys(self, task: Task) -> list[str]:
        """KEYS of the create and save scripts: task, due:pending, due:processing[, idem]."""
        idem = [] if task.idempotency_key is None else [self._prefix + "idem:" + task.idempotency_key]
        return [self._task_key(task.id), *self._due, *idem]

    def _ttl_ms(self, task: Task) -> int:
        if task.state.terminal and task.expires_at is not None:
            return max(MIN_TERMINAL_TTL_MS, round((task.expires_at - self._clock()) * 1000))
        return self._unfinished_ttl_ms

    def _expired(self, task: Task) -> bool:
        return task.expires_at is not None and task.expires_at < self._clock()


def _ttl_ms(seconds: float) -> str:
    return str(max(1, round(seconds * 1000)))


def _number(value: float | None) -> str:
    return "" if value is None else repr(value)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _decode(record: Any) -> Task:
    try:
        return Task.from_json(bytes(record))
    except (ValueError, TypeError, KeyError) as exc:
        raise TaskStoreError("redis task record is malformed", detail=f"{type(exc).__name__}: {exc}") from exc


_TERMINAL_LUA = "{" + ", ".join(f"[{state.value!r}] = true" for state in sorted(TERMINAL_STATES)) + "}"
# Moves the task's id (ARGV[1]) into the due set of its new state (ARGV[state]) at score ARGV[due], or out of all.
_INDEX_LUA = (
    "local function index(state, due)\n"
    + "".join(f"  redis.call('ZREM', KEYS[{n}], ARGV[1])\n" for n in range(2, 2 + len(OPEN_STATES)))
    + "".join(
        f"  if state == {state.value!r} then redis.call('ZADD', KEYS[{n}], due, ARGV[1]) end\n"
        for n, state in enumerate(OPEN_STATES, start=2)
    )
    + "end\n"
)
_IDEM = f"KEYS[{2 + len(OPEN_STATES)}]"

# KEYS: task, due:pending, due:processing[, idem][, lease]. ARGV: id, version, state, expires_at ('' = none),
# record, terminal (1/0), ttl_ms, prefix, now (store clock), due_at[, lease owner, lease ttl_ms]. Returns 1 when
# stored (and the lease taken), else the record of the task already holding the key (or stored under the same
# id). A holder past its expires_at, or gone, leaves the key free.
_CREATE_LUA = (
    _INDEX_LUA
    + """
local lease = ARGV[11] and table.remove(KEYS)  -- the last key when a lease comes along; KEYS[4] is then idem's
local function live(key)
  local held = redis.call('HMGET', key, 'record', 'expires_at')
  if held[1] and (held[2] == '' or tonumber(held[2]) >= tonumber(ARGV[9])) then return held[1] end
  return nil
end
if IDEM then
  local holder = redis.call('GET', IDEM)
  local record = holder and live(ARGV[8] .. 'task:' .. holder)
  if record then return record end
end
local record = live(KEYS[1])
if record then return record end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'state', ARGV[3], 'expires_at', ARGV[4], 'record', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
if IDEM then redis.call('SET', IDEM, ARGV[1], 'PX', ARGV[7]) end
if lease then redis.call('SET', lease, ARGV[11], 'PX', ARGV[12]) end
index(ARGV[3], ARGV[10])
return 1
"""
).replace("IDEM", _IDEM)

# KEYS: task, due:pending, due:processing[, idem][, lease]. ARGV: id, expected version, version, state, expires_at,
# record, terminal (1/0), ttl_ms, channel, origin, due_at[, lease owner, lease ttl_ms]. Returns 1 when written and
# announced ('{origin} {id}'), the lease taken unless another owner holds it; 0 when the stored version differs,
# the stored task has ended, or it is gone (then no lease is taken).
_SAVE_LUA = (
    _INDEX_LUA
    + f"""
local lease = ARGV[12] and table.remove(KEYS)  -- the last key when a lease comes along; KEYS[4] is then idem's
local terminal = {_TERMINAL_LUA}
local stored = redis.call('HMGET', KEYS[1], 'version', 'state')
if not stored[1] or tonumber(stored[1]) ~= tonumber(ARGV[2]) or terminal[stored[2]] then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[3], 'state', ARGV[4], 'expires_at', ARGV[5], 'record', ARGV[6])
if ARGV[7] == '1' then
  redis.call('PEXPIRE', KEYS[1], ARGV[8])
  if {_IDEM} and redis.call('GET', {_IDEM}) == ARGV[1] then redis.call('PEXPIRE', {_IDEM}, ARGV[8]) end
end
index(ARGV[4], ARGV[11])
if lease then
  local owner = redis.call('GET', lease)
  if not owner or owner == ARGV[12] then redis.call('SET', lease, ARGV[12], 'PX', ARGV[13]) end
end
redis.call('PUBLISH', ARGV[9], ARGV[10] .. ' ' .. ARGV[1])
return 1
"""
)

# KEYS: lease. ARGV: owner, ttl_ms. Takes a free lease or extends the owner's own; 0 while another holds it.
_ACQUIRE_LUA = """
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS: lease. ARGV: owner. Deletes the lease only if the owner still holds it.
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
