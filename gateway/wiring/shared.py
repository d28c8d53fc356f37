"""What several features share: the process's one Redis connection and its name on task leases."""

from __future__ import annotations

import os
import socket
import uuid

from gateway.redis_client import RedisConnection
from gateway.settings import RedisSettings


def shared_redis(config: RedisSettings) -> RedisConnection | None:
    """The one Redis connection (client and circuit) of the caches, quotas, task store, keys and usage record."""
    url = config.url_value()
    if url is None:
        return None
    return RedisConnection(url, timeout_seconds=config.timeout_seconds, backoff_seconds=config.backoff_seconds)


def replica_name() -> str:
    """This process's name on task leases: unique even for replicas sharing a host."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
