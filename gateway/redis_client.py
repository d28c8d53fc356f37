"""The one Redis client factory and the failures a Redis call can raise, for the caches, quotas and task store.

Each user keeps its own policy for a failure (a cache misses, a quota falls back to per-replica limits, a task
store answers 503); what they share is how the client is built: a bounded pool, the caller's timeout on every
socket operation, and at most one immediate reconnect. redis-py's default retries (exponential back-off,
timeouts included) would turn a hung Redis into seconds of latency per call.

The URL may hold a password: it is never put into messages or logs.
"""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

REDIS_FAILURES = (RedisError, OSError, asyncio.TimeoutError)

# Connections per client. Requests queue for one of these instead of opening a socket each: a burst
# of hundreds of concurrent connects would itself time out on a busy host.
MAX_CONNECTIONS = 16


def redis_client(url: str, timeout_seconds: float, health_check_interval: int = 30) -> aioredis.Redis:
    """The client over a bounded pool; a malformed URL is reported without echoing any part of it."""
    try:
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=MAX_CONNECTIONS,
            timeout=timeout_seconds,
            socket_timeout=timeout_seconds,
            socket_connect_timeout=timeout_seconds,
            health_check_interval=health_check_interval,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
    except ValueError:
        raise ValueError("REDIS_URL is malformed (expected redis://, rediss:// or unix://)") from None
    return aioredis.Redis.from_pool(pool)  # the client owns the pool and closes it
