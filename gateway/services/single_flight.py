"""Single flight: concurrent requests that need the same result share one call instead of repeating it.

`SingleFlight` (chat): a call runs in a task of its own, registered under one key or several. Waiters await
it through `asyncio.shield`, so a waiter that goes away cancels only its own wait. With
`cancel_when_abandoned` the call is cancelled once its last waiter has gone (it holds something worth
freeing, such as a quota slot), and a request arriving after that starts a call of its own; without it
the call runs to the end for whoever asks for its keys meanwhile.

Every call's exception is retrieved when it finishes: the waiters re-raise it, and a call that
nobody awaited any more must not log "Task exception was never retrieved".

`CallerLedFlight` (embeddings): the first caller makes the call itself, the others follow it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Coroutine, Hashable, Iterable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class SingleFlight(Generic[K, T]):
    """Calls in flight by key, each shared by the requests awaiting it."""

    def __init__(self, *, cancel_when_abandoned: bool = False) -> None:
        self._cancel_when_abandoned = cancel_when_abandoned
        self._tasks: dict[K, asyncio.Task[T]] = {}
        self._keys: dict[asyncio.Task[T], list[K]] = {}  # the keys each running call answers
        self._waiters: Counter[asyncio.Task[T]] = Counter()

    def running(self, key: K) -> asyncio.Task[T] | None:
        """The call in flight for `key`, or None."""
        return self._tasks.get(key)

    def start(self, keys: Iterable[K], call: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run `call` in a task of its own, shared from now on by every request for one of `keys`."""
        task = asyncio.create_task(call)
        owned = list(keys)
        for key in owned:
            self._tasks[key] = task
        self._keys[task] = owned
        task.add_done_callback(self._finished)
        return task

    async def wait(self, task: asyncio.Task[T]) -> T:
        """`task`'s result; leaving early (cancelled) does not cancel the task, unless this was its last
        waiter and the calls are `cancel_when_abandoned`."""
        self._waiters[task] += 1
        try:
            return await asyncio.shield(task)
        finally:
            self._waiters[task] -= 1
            if not self._waiters[task]:
                del self._waiters[task]
                if self._cancel_when_abandoned and not task.done():
                    self._forget(task)  # a request arriving now starts its own call
                    task.cancel()

    async def run(self, key: K, call: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """The result of the call in flight for `key`, else of `call()` started for it."""
        task = self.running(key)
        if task is None:
            task = self.start([key], call())
        return await self.wait(task)

    def _finished(self, task: asyncio.Task[T]) -> None:
        self._forget(task)
        if not task.cancelled():
            task.exception()  # retrieved here: the waiters re-raise it, nobody else must log it

    def _forget(self, task: asyncio.Task[T]) -> None:
        for key in self._keys.pop(task, ()):
            if self._tasks.get(key) is task:  # a newer call may have taken the key
                del self._tasks[key]


class CallAbandonedError(Exception):
    """The caller making the call went away (cancelled) before it ended; never answered to a client.

    Do: nothing: each caller that followed it makes the call again.
    """


class CallerLedFlight(Generic[K, T]):
    """Single flight in which the first caller makes the call itself, in its own task; callers for one of its
    keys that come meanwhile await its outcome. `SingleFlight` gives each call a task of its own, which outlives its
    callers; here the call costs no task, no shield and no extra turn of the loop, which is most of what an
    embedding call of one text costs the gateway when the texts of concurrent requests differ, as they nearly
    always do. The price is paid in the rare other case: when the first caller goes away, its call goes with
    it, and its followers get `CallAbandonedError` and make the call themselves."""

    def __init__(self) -> None:
        self._outcomes: dict[K, asyncio.Future[T]] = {}

    def running(self, key: K) -> asyncio.Future[T] | None:
        """The outcome of the call in flight for `key`, or None."""
        return self._outcomes.get(key)

    async def lead(self, keys: list[K], call: Coroutine[Any, Any, T]) -> T:
        """`call`'s result, made here; until it ends, the call answers every request for one of `keys`."""
        outcome: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        for key in keys:
            self._outcomes[key] = outcome
        try:
            result = await call
        except BaseException as exc:
            gone = isinstance(exc, asyncio.CancelledError)
            outcome.set_exception(CallAbandonedError("the caller making the call went away") if gone else exc)
            outcome.exception()  # retrieved: nobody may be following
            raise
        finally:
            for key in keys:
                if self._outcomes.get(key) is outcome:
                    del self._outcomes[key]
        outcome.set_result(result)
        return result

    async def follow(self, outcome: asyncio.Future[T]) -> T:
        """The outcome of a call another caller makes; a follower that goes away leaves it to the others."""
        return await asyncio.shield(outcome)
