"""The one Redis client factory, the failures a Redis call can raise, and the circuit every Redis user shares.

Each user keeps its own policy for a failure (a cache misses, a quota falls back to per-replica limits, a task
store answers 503); what they share is how the client is built: a bounded pool, the caller's timeout on every
socket operation (connect and pool wait included), and at most one immediate reconnect. redis-py's default
retries (exponential back-off, timeouts included) would turn a hung Redis into seconds of latency per call.

They also share one `RedisCircuit` through one `RedisConnection`: a Redis that does not answer is treated as down
by every user at once. For `backoff_seconds` calls are skipped without touching the network (`RedisSkippedError`,
one of `REDIS_FAILURES`); then one PING, the probe, goes in the background (when the window ends, whether or not
calls come) while calls are still skipped; it closes the circuit or opens it for another window. So a frozen Redis
costs one call's deadline to the requests already waiting on it when it froze, not a timeout to every request (and
none per window), and the outage is logged once when it starts and once when it ends.

What opens the circuit:

- a connection error (refused, reset, closed by Redis): Redis is down, at once;
- a health PING that times out while this process's event loop kept running on time (`_LoopWatch`): Redis itself
  does not answer (SIGSTOP, a hung node, a partition).

What does not: a user's call that times out, or finds no free connection in the pool within its timeout
(`RedisPoolBusyError`), fails alone (counted in `gateway_redis_call_failures_total{reason}`) and starts that
health PING in the background (one at a time). A process starved of CPU reads its answers late: its calls time
out and its pool empties although Redis answers, so such a call is no verdict on Redis; the PING is, unless the
event loop itself stalled while it waited (then it is no verdict either, and the next timeout sends another).

The URL may hold a password: it is never put into messages or logs.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from contextlib import suppress
from enum import Enum
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway import metrics

log = logging.getLogger(__name__)
T = TypeVar("T")

REDIS_FAILURES = (RedisError, OSError, asyncio.TimeoutError)
# Failures that say Redis did not answer a call (as opposed to answering with an error, e.g. a script's).
OUTAGES = (RedisConnectionError, RedisTimeoutError, OSError, asyncio.TimeoutError)
# The part of OUTAGES that may be this process's fault (starved of CPU, it read the answer too late): a user's call
# that times out fails alone; only a health PING's timeout on a loop that ran on time opens the circuit.
TIMEOUTS = (RedisTimeoutError, asyncio.TimeoutError)

# Connections per client, shared by every Redis user of the process. Requests queue for one of these instead
# of opening a socket each: a burst of hundreds of concurrent connects would itself time out on a busy host.
MAX_CONNECTIONS = 64
# A connection unused this long is closed (when a later one is released): redis-py keeps every connection a burst
# opened, so that after a Redis outage (every waiting call reconnects at once) a replica would hold up to
# MAX_CONNECTIONS idle sockets for the rest of its life. The pool hands out the most recently used connection
# first, so those a steady load needs stay open and the surplus ages out.
IDLE_CLOSE_SECONDS = 60.0


class RedisSkippedError(RedisConnectionError):
    """A call not made: the circuit is open (Redis failed recently), or another call is probing it. Its
    caller falls back as for an outage (caches miss, quotas count per replica).

    Do: nothing per call; operator: restore Redis; the circuit probes it again after `REDIS_BACKOFF_SECONDS`.
    """


class RedisPoolBusyError(RedisError):
    """A call not made: every connection of the pool stayed in use for the whole timeout. Not an outage: the
    call fails alone, and the circuit stays closed.

    Do: nothing per call; operator: a rising `gateway_redis_pool_busy_total` means a pod short of CPU or a
    slow Redis.
    """


class _BoundedPool(aioredis.BlockingConnectionPool):
    """redis-py's blocking pool, whose wait for a free connection fails with its own error rather than with the
    `ConnectionError` of a Redis that cannot be reached, and which closes connections idle for
    `IDLE_CLOSE_SECONDS`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._released_at: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

    async def release(self, connection: Any) -> None:
        self._released_at[connection] = time.monotonic()
        await super().release(connection)
        for idle in self._take_idle():
            await idle.disconnect()

    def _take_idle(self) -> list[Any]:
        """Idle connections out of the pool (it opens new ones when it needs them again)."""
        idle, available = [], self._available_connections  # least recently released first
        deadline = time.monotonic() - IDLE_CLOSE_SECONDS
        while available and self._released_at.get(available[0], deadline) <= deadline:
            idle.append(available.pop(0))
        return idle

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        except RedisConnectionError as exc:
            if not isinstance(exc.__cause__, asyncio.TimeoutError):
                raise  # connecting failed (a connect timeout is redis' TimeoutError), not the wait for a turn
            metrics.REDIS_POOL_BUSY.inc()
            raise RedisPoolBusyError(f"all {self.max_connections} Redis connections stayed in use") from None


def redis_client(
    url: str, timeout_seconds: float, health_check_interval: int = 30, max_connections: int = MAX_CONNECTIONS
) -> aioredis.Redis:
    """The client over a bounded pool; a malformed URL is reported without echoing any part of it."""
    try:
        pool = _BoundedPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout_seconds,
            socket_timeout=timeout_seconds,
            socket_connect_timeout=timeout_seconds,
            health_check_interval=health_check_interval,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
    except ValueError:
        raise ValueError("REDIS_URL is malformed (expected redis://, rediss:// or unix://)") from None
    return aioredis.Redis.from_pool(pool)  # the client owns the pool and closes it


class CircuitState(str, Enum):
    CLOSED = "closed"  # calls go through
    OPEN = "open"  # calls are skipped until the back-off window ends
    PROBING = "probing"  # one call is trying Redis; the others are skipped


class RedisCircuit:
    """closed --(connection error, or a health PING's timeout)--> open --(`backoff_seconds`, then `admit_probe`)-->
    probing --(its success)--> closed, or --(its failure)--> open. Only `admit_probe` calls may probe; `admit` calls
    are skipped until the circuit is closed. A probe abandoned without a verdict (cancelled) lets the next one probe
    at once.

    Logs one WARNING when it opens and one INFO when it closes again; `gateway_redis_circuit_open{client}` is 1
    while calls are skipped."""

    def __init__(self, name: str, backoff_seconds: float = 1.0, *, clock: Callable[[], float] = time.monotonic):
        if backoff_seconds <= 0:
            raise ValueError(f"backoff_seconds must be > 0, got {backoff_seconds}")
        self.name = name
        self.backoff_seconds = backoff_seconds
        self._clock = clock
        self._state = CircuitState.CLOSED
        self._retry_at = float("-inf")  # on `clock`: when an open circuit lets the next call probe
        metrics.REDIS_CIRCUIT_OPEN.labels(client=name).set(0)

    def __repr__(self) -> str:
        return f"RedisCircuit(name={self.name!r}, state={self._state.value!r})"

    @property
    def state(self) -> CircuitState:
        return self._state

    @property
    def closed(self) -> bool:
        return self._state is CircuitState.CLOSED

    @property
    def probe_due(self) -> bool:
        """Open, and its back-off window is over."""
        return self._state is CircuitState.OPEN and self._clock() >= self._retry_at

    def admit(self) -> None:
        """Let a call through while closed; raise `RedisSkippedError` if not."""
        if self._state is not CircuitState.CLOSED:
            raise self._skipped()

    def admit_probe(self) -> None:
        """Let a call through while closed, or as the probe once the window is over; raise `RedisSkippedError`
        if not."""
        if self.probe_due:
            self._state = CircuitState.PROBING
        elif self._state is not CircuitState.CLOSED:
            raise self._skipped()

    def succeeded(self) -> None:
        if self._state is not CircuitState.CLOSED:
            self._state = CircuitState.CLOSED
            metrics.REDIS_CIRCUIT_OPEN.labels(client=self.name).set(0)
            log.info("Redis (client %s) answers again; its users are back on it", self.name)

    def failed(self, exc: BaseException) -> None:
        self._retry_at = self._clock() + self.backoff_seconds
        if self._state is CircuitState.CLOSED:
            metrics.REDIS_CIRCUIT_OPEN.labels(client=self.name).set(1)
            log.warning(
                "Redis (client %s) does not answer (%s: %s); skipping it for %g s windows (caches miss, quotas "
                "and key limits limit this replica alone, tasks answer 503, usage records are not stored, the "
                "keys in force stay) until a probe succeeds",
                self.name,
                type(exc).__name__,
                exc,
                self.backoff_seconds,
            )
        self._state = CircuitState.OPEN

    def abandoned(self) -> None:
        """The admitted call ended with no verdict on Redis (cancelled): a probe's turn passes to the next one."""
        if self._state is CircuitState.PROBING:
            self._state = CircuitState.OPEN
            self._retry_at = self._clock()

    def _skipped(self) -> RedisSkippedError:
        if self._state is CircuitState.PROBING:
            return RedisSkippedError("backing off after a failure, Redis is being probed")
        return RedisSkippedError(f"backing off after a failure, {self._retry_at - self._clock():.2f} s left")


class RedisConnection:
    """A Redis client and its circuit, shared by every Redis user of the process (`shared()`); the client is
    closed when the last user closes it. Each call is bounded by `2 * timeout_seconds` (a connect and a command)
    whatever redis-py does inside: pool wait, reconnect and health check included."""

    def __init__(
        self,
        url: str,
        *,
        name: str = "redis",
        timeout_seconds: float = 0.25,
        backoff_seconds: float = 1.0,
        health_check_interval: int = 30,
        max_connections: int = MAX_CONNECTIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = redis_client(url, timeout_seconds, health_check_interval, max_connections)
        self.circuit = RedisCircuit(name, backoff_seconds, clock=clock)
        self.timeout_seconds = timeout_seconds
        self._users = 1
        self._check: asyncio.Task[None] | None = None
        self._probe_timer: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"RedisConnection(circuit={self.circuit!r})"  # no URL: it may hold a password

    @classmethod
    def shared(cls, redis: str | RedisConnection, **options: Any) -> RedisConnection:
        """`redis` itself, one user more, when it is a connection; else a connection of its own to the URL."""
        if isinstance(redis, RedisConnection):
            redis._users += 1
            return redis
        return cls(redis, **options)

    async def call(self, command: Callable[[], Awaitable[T]]) -> T:
        """`command()` through the circuit: `RedisSkippedError` while it is not closed, else the result or its
        failure. A caller never probes: a skipped call whose window is over starts the probe in the background
        (a PING), so no request, nor a quota's queue behind one, waits on a Redis that may still hang."""
        try:
            self.circuit.admit()
        except RedisSkippedError:
            if self.circuit.probe_due:
                self._check_in_background()
            raise
        return await self._guarded(command)

    async def _guarded(self, command: Callable[[], Awaitable[T]], watch: _LoopWatch | None = None) -> T:
        """Run an admitted call within its deadline and give the circuit its verdict. `watch` is given for a
        health PING alone: only its timeout may open the circuit (see the module's docstring)."""
        try:
            async with asyncio.timeout(2 * self.timeout_seconds):
                result = await command()
        except TIMEOUTS as exc:
            if watch is None:  # a user's call: maybe this process was too slow to read the answer
                self._count("timeout")
                self._check_in_background()
            elif self.circuit.closed and watch.stalled_for() > self.timeout_seconds / 2:
                log.debug("Redis health PING timed out while the event loop stalled %.3f s", watch.stalled_for())
            else:
                self.circuit.failed(exc)
                self._probe_after_the_window()
            raise
        except OUTAGES as exc:  # refused, reset, closed: Redis is down whoever called
            if watch is None:
                self._count("connection")
            self.circuit.failed(exc)
            self._probe_after_the_window()
            raise
        except RedisPoolBusyError:
            self._count("pool_busy")
            self.circuit.abandoned()  # no verdict on Redis: the calls holding the connections will give one
            raise
        except RedisError:
            self.circuit.succeeded()  # Redis answered, with an error of the command's own
            raise
        except BaseException:
            self.circuit.abandoned()
            raise
        self.circuit.succeeded()
        return result

    def _count(self, reason: str) -> None:
        metrics.REDIS_CALL_FAILURES.labels(client=self.circuit.name, reason=reason).inc()

    def known_up(self) -> bool:
        """Whether Redis answered last time, without waiting on it; a PING in the background refreshes that
        (one at a time), so a Redis that froze while nobody called it is found out by the next check."""
        self._check_in_background()
        return self.circuit.closed

    async def aclose(self) -> None:
        self._users -= 1
        if self._users > 0:
            return
        if self._probe_timer is not None:
            self._probe_timer.cancel()
        if self._check is not None:
            self._check.cancel()
        await self.client.aclose()

    def _probe_after_the_window(self) -> None:
        """Probe when the window ends even if no call comes, so the circuit closes as soon as Redis is back."""
        if self._probe_timer is not None:
            self._probe_timer.cancel()
        loop = asyncio.get_running_loop()
        # A little after the window: asyncio may run a timer up to its clock's resolution early.
        self._probe_timer = loop.call_later(self.circuit.backoff_seconds + 0.005, self._check_in_background)

    def _check_in_background(self) -> None:
        if self._check is None or self._check.done():
            self._check = asyncio.ensure_future(self._ping())

    async def _ping(self) -> None:
        with suppress(*REDIS_FAILURES):  # the circuit has noted it
            self.circuit.admit_probe()
            watch = _LoopWatch()
            try:
                await self._guarded(self.client.ping, watch)
            finally:
                watch.stop()


class _LoopWatch:
    """How late the event loop ran a callback that asks to run every `interval` s, while a health PING waits:
    a PING that timed out while the loop itself stalled (a process starved of CPU) says nothing about Redis.
    A callback, not a task: a few microseconds per beat, and only while a PING is out."""

    def __init__(self, interval: float = 0.01) -> None:
        self._loop = asyncio.get_running_loop()
        self._interval = interval
        self._last = self._loop.time()
        self._worst = 0.0
        self._handle = self._loop.call_later(interval, self._beat)

    def _beat(self) -> None:
        now = self._loop.time()
        self._worst = max(self._worst, now - self._last - self._interval)
        self._last = now
        self._handle = self._loop.call_later(self._interval, self._beat)

    def stalled_for(self) -> float:
        """The longest the loop ran this watch's callback late, seconds, the wait going on now included."""
        return max(self._worst, self._loop.time() - self._last - self._interval)

    def stop(self) -> None:
        self._handle.cancel()
