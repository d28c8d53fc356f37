"""The thread pool a vector store's synchronous engine runs on, so its calls never block the event loop.

Each call is timed and counted by store and operation, and an engine's exception becomes
`SearchStoreUnavailableError` naming the store (its text goes to the operator's log only).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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
        operation = getattr(call, "__name__", "call").lstrip("_")
        started = time.perf_counter()
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, partial(call, *args))
        except GatewayError:
            raise
        except Exception as exc:  # the engines raise their own exceptions, the OS raises OSError
            metrics.SEARCH_STORE_ERRORS.labels(self._store, operation).inc()
            raise SearchStoreUnavailableError(
                f"the search store ({self._store}) failed; try again later", detail=repr(exc)
            ) from exc
        finally:
            metrics.SEARCH_STORE_LATENCY.labels(self._store, operation).observe(time.perf_counter() - started)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)
