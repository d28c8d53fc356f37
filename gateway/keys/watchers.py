"""Task watchers per API key, and the permits one connection holds.

A watcher is one task followed by one connection: an event stream (REST or gRPC) is one, a WebSocket one per task it
follows and at least one while it follows none (an idle socket still holds a connection). Each takes a permit from
the process's budget (`GATEWAY_MAX_TASK_WATCHERS`, shared by every caller) and one from its key's
(`GATEWAY_MAX_TASK_WATCHERS_PER_CALLER`), so one key cannot hold every watcher of a replica. The keys' counts are
this process's: with N replicas a key may hold N times its limit, as it may hold N times the process budget.
"""

from __future__ import annotations

from gateway.errors import RateLimitExceededError
from gateway.keys.model import ApiKey
from gateway.keys.resolver import ANONYMOUS
from gateway.limits import InFlightLimit

LIMIT_ENV = "GATEWAY_MAX_TASK_WATCHERS_PER_CALLER"
DEFAULT_PER_KEY = 256


class TooManyWatchersError(RateLimitExceededError):
    """The API key already holds its maximum of task watchers on this replica (`GATEWAY_MAX_TASK_WATCHERS_PER_CALLER`:
    event streams, gRPC watches and WebSocket subscriptions together). A WebSocket that would pass it is closed with
    1008 after an error message saying so.

    Do: client: close a stream or socket, or unsubscribe from finished tasks, before watching more; operator: raise
    the limit for back ends that watch many tasks through one key.
    """

    code = "too_many_watchers"


class KeyWatchers:
    """How many watchers each key holds in this process. Not applied to the anonymous caller of a gateway without
    keys: everyone is that caller, and the process budget bounds it."""

    def __init__(self, maximum: int = DEFAULT_PER_KEY) -> None:
        if maximum <= 0:
            raise ValueError("the per-key watcher maximum must be positive")
        self.maximum = maximum
        self._held: dict[str, int] = {}

    def take(self, key: ApiKey, count: int = 1) -> None:
        """`count` more for `key`, or `TooManyWatchersError` (and none taken)."""
        if key.id == ANONYMOUS.id or count <= 0:
            return
        held = self._held.get(key.id, 0)
        if held + count > self.maximum:
            raise TooManyWatchersError(
                f"API key {key.prefix} already watches {held} task(s) on this server; its limit is {self.maximum} "
                f"({LIMIT_ENV}): close a stream or socket first",
                retry_after=5,
            )
        self._held[key.id] = held + count

    def give_back(self, key: ApiKey, count: int = 1) -> None:
        if key.id == ANONYMOUS.id or count <= 0:
            return
        held = self._held.get(key.id, 0) - count
        if held > 0:
            self._held[key.id] = held
        else:
            self._held.pop(key.id, None)

    def held(self, key: ApiKey) -> int:
        return self._held.get(key.id, 0)


class WatcherPermits:
    """The watcher permits one connection holds for one key, from the process's budget and the key's. `process`:
    None where the process's permit is taken apart (an event stream's, by the REST limits middleware before any
    key is known)."""

    def __init__(self, process: InFlightLimit | None, keys: KeyWatchers, key: ApiKey) -> None:
        self._process = process
        self._keys = keys
        self._key = key
        self.held = 0

    def hold(self, count: int) -> None:
        """Hold `count` permits in all, taking or giving back the difference; raises (and changes nothing) when
        the process's budget (`OverloadedError`) or the key's (`TooManyWatchersError`) has too few left."""
        if count < self.held:
            self._give_back(self.held - count)
            return
        wanted = count - self.held
        if self._process is not None:
            taken = 0
            while taken < wanted and self._process.acquire():
                taken += 1
            if taken < wanted:
                self._release_process(taken)
                raise self._process.overloaded()
        try:
            self._keys.take(self._key, wanted)
        except TooManyWatchersError:
            self._release_process(wanted)
            raise
        self.held = count

    def release(self) -> None:
        self._give_back(self.held)

    def _give_back(self, count: int) -> None:
        self._keys.give_back(self._key, count)
        self._release_process(count)
        self.held -= count

    def _release_process(self, count: int) -> None:
        if self._process is None:
            return
        for _ in range(count):
            self._process.release()
