"""Read-your-writes on Milvus without Strong consistency: the last write's timestamp of each collection, shared by
every replica, is the guarantee a later read waits for.

Milvus answers a read at the consistency it is asked for. `Strong` waits for the query node to catch up with the
current time, a time tick (200 ms) on every read, written to or not. Instead each write's hybrid timestamp (Milvus
returns it with the mutation) is kept per collection, in this process and, with Redis, in
`gateway:search-writes:<milvus>:<collection>` for every replica; a read then asks for:

    a write within WINDOW_SECONDS     Customized, guarantee = that timestamp: it sees the write, waiting at most a
                                      time tick, and only when it comes right after the write
    none                              Bounded: no wait; it sees everything older than Milvus's `common.gracefulTime`
                                      (5 s by default), which every write past the window is
    Redis failed or skipped           Strong for this read: slower, never stale, never an error

A Redis key lives WINDOW_SECONDS; only a timestamp from the same Milvus is a usable guarantee (a later one from
another server's clock would hold reads back), hence the server's digest in the key. Without Redis a replica knows
its own writes alone, and reads Strong for its first STARTUP_SECONDS: what the process before it wrote (a restart,
a rolling update, a job) is then older than Bounded's lag. Replicas that write at once share it through Redis.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from gateway.redis_client import REDIS_FAILURES, RedisConnection, RedisSkippedError

log = logging.getLogger(__name__)

KEY_PREFIX = "gateway:search-writes:"
WINDOW_SECONDS = 60.0  # far above Milvus's gracefulTime (5 s): past it Bounded sees the write
STARTUP_SECONDS = 6.0  # Milvus's gracefulTime (5 s by default) and a margin
# The larger timestamp wins: replicas writing at once must not move the guarantee back. Compared as decimal strings
# (length, then text): a hybrid timestamp has 59 bits, more than a Lua number holds exactly.
_MAX_LUA = """
local held, new = redis.call('GET', KEYS[1]), ARGV[1]
if not held or #held < #new or (#held == #new and held < new) then
  redis.call('SET', KEYS[1], new, 'PX', ARGV[2])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
"""


@dataclass(frozen=True)
class ReadLevel:
    """The consistency one Milvus read asks for, and its guarantee timestamp when `Customized`."""

    consistency: str
    timestamp: int = 0

    def options(self) -> dict[str, Any]:
        """The keyword arguments of a pymilvus `search` or `query`; they override the collection's own level."""
        if self.consistency == "Customized":
            return {"consistency_level": "Customized", "guarantee_timestamp": self.timestamp}
        return {"consistency_level": self.consistency}


STRONG = ReadLevel("Strong")
BOUNDED = ReadLevel("Bounded")


class WriteClock:
    """The last write timestamp of each collection, here and in Redis when there is one."""

    def __init__(
        self,
        redis: str | RedisConnection | None,
        server: str,
        *,
        window_seconds: float = WINDOW_SECONDS,
        startup_seconds: float = STARTUP_SECONDS,
    ) -> None:
        """`redis`: the process's shared connection (this clock becomes one more user of it), or a URL."""
        self._redis = RedisConnection.shared(redis) if redis is not None else None
        self._scope = hashlib.sha256(server.encode()).hexdigest()[:12]  # the URI may hold a password
        self._window = window_seconds
        self._strong_until = time.monotonic() + startup_seconds if self._redis is None else 0.0
        self._local: dict[str, tuple[int, float]] = {}  # collection -> (timestamp, monotonic expiry)
        self._script = self._redis.client.register_script(_MAX_LUA) if self._redis is not None else None

    async def wrote(self, target: str, timestamp: int) -> None:
        """Note a write that returned with `timestamp`. Kept here whatever happens; a Redis failure is logged and
        leaves other replicas on their own window (a Redis that fails their reads makes those Strong)."""
        if not timestamp:
            return
        self._local[target] = (max(timestamp, self._held(target)), time.monotonic() + self._window)
        if self._redis is None or self._script is None:
            return
        script, key, ttl_ms = self._script, self._key(target), int(self._window * 1000)
        try:
            await self._redis.call(lambda: script(keys=[key], args=[timestamp, ttl_ms]))
        except RedisSkippedError:
            pass  # Redis is known to be down (logged once, by the connection): other replicas read Strong
        except REDIS_FAILURES as exc:
            log.warning("search: could not share a Milvus write's timestamp through Redis: %s", type(exc).__name__)

    async def level(self, target: str) -> ReadLevel:
        """What a read of `target` asks for now (see the module's docstring)."""
        local = self._held(target)
        if self._redis is None:
            if local:
                return ReadLevel("Customized", local)
            return STRONG if time.monotonic() < self._strong_until else BOUNDED
        client, key = self._redis.client, self._key(target)
        try:
            shared = await self._redis.call(lambda: client.get(key))
        except REDIS_FAILURES:
            return STRONG
        latest = max(local, int(shared) if shared else 0)
        return ReadLevel("Customized", latest) if latest else BOUNDED

    def _held(self, target: str) -> int:
        held = self._local.get(target)
        return held[0] if held is not None and held[1] > time.monotonic() else 0

    async def aclose(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    def _key(self, target: str) -> str:
        return f"{KEY_PREFIX}{self._scope}:{target}"
