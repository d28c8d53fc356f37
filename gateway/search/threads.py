"""The thread pool a vector store's synchronous engine runs on, so its calls never block the event loop.

Each call is timed and counted by store and operation, and an engine's exception becomes
`SearchStoreUnavailableError` naming the store (its text goes to the operator's log only). `run_here` does the
same for a call made on the event loop's own thread: only for engine calls that hold the GIL from start to end,
which stop the event loop just as much from a worker thread, where the hand-over to the thread and back also
costs a wait in the loop's queue each time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

from gateway import metrics
from gateway.errors import GatewayError
from gateway.search.store import SearchStoreUnavailableError

T = TypeVar("T")


class StoreThreads:
    def __init__(self, store: str, max_threads: int) -> None:
        self._store = store
        self._executor = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix=f"search-{store}")

    async def run(self, call: Callable[..., T], *args: Any) -> T:
        with self._measured(call):
            return await asyncio.get_running_loop().run_in_executor(self._executor, partial(call, *args))

    def run_here(self, call: Callable[..., T], *args: Any) -> T:
        with self._measured(call):
            return call(*args)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)

    @contextmanager
    def _measured(self, call: Callable[..., Any]) -> Iterator[None]:
        operation = getattr(call, "__name__", "call").lstrip("_")
        started = time.perf_counter()
        try:
            yield
        except GatewayError:
            raise
        except Exception as exc:  # the engines raise their own exceptions, the OS raises OSError
            metrics.SEARCH_STORE_ERRORS.labels(self._store, operation).inc()
            raise SearchStoreUnavailableError(
                f"the search store ({self._store}) failed; try again later", detail=repr(exc)
            ) from exc
        finally:
            metrics.SEARCH_STORE_LATENCY.labels(self._store, operation).observe(time.perf_counter() - started)
