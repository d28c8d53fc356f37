"""The interface every cache store implements: bytes in, bytes out, keyed by str.

Stores never raise for a missing key. A store that fails (Redis down, timeout)
raises `CacheStoreError`; callers count it and serve without the cache.
"""

from __future__ import annotations

from typing import Protocol


class CacheStoreError(Exception):
    """The cache store (Redis) failed a call, or skipped it while its circuit is open; never answered to a
    client: the request goes on without the cache.

    Do: nothing for clients; operator: `gateway_cache_errors_total` and Redis's health.
    """


class ByteStore(Protocol):
    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        """Values for `keys`, in order; None where absent."""
        ...

    async def set_many(self, items: dict[str, bytes], ttl_seconds: int | None = None) -> None:
        """Store every item; `ttl_seconds` None keeps them until evicted."""
        ...

    async def ping(self) -> bool:
        """Whether the store answers now (used by /readyz)."""
        ...

    async def aclose(self) -> None: ...
