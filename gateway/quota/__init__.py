"""Keeps calls to a third-party API inside the account's quota: requests/second, concurrent calls, tokens/minute.

The quota belongs to the upstream account, not to a pod, so `RedisQuotaLimiter` keeps the state in Redis and
every replica runs the same atomic Lua scripts against it, on Redis' clock. `LocalQuotaLimiter` runs the same
arithmetic in process: for a single replica, for tests, and as the fallback while Redis is unreachable (a dead
Redis must not fail requests; each replica then limits itself alone).

The three limits, all checked and taken together or not at all (times in integer microseconds):

- rate: GCRA with a burst of one. A call is admitted when now >= TAT (theoretical arrival time) and TAT becomes
  now + interval, with interval = floor((1 s + margin) / rps) + 1 µs. So any rps + 1 admissions span more than
  1 s + margin, and no 1-second window at the upstream holds more than rps calls (integer rps) whatever its
  windowing, as long as no call travels `rate_margin_seconds` longer than another from admission to upstream.
  A burst is spread out: (position in queue) * interval of added latency.
- concurrency: a lease per call (Redis: a sorted set scored by expiry, renewed while held), so a crashed
  replica's slot frees itself after `lease_seconds` while a slow call keeps its own.
- tokens: a bucket of `tokens_per_minute` refilled continuously; the estimate is taken on entry and the
  difference to `Slot.settle()` is given back or charged when the block exits (the balance may go negative).

A call that tries the upstream again inside its slot (a retry after a 429 or a 5xx) is one more arrival
there: `Slot.pace()` waits for the rate alone before it (the slot and the tokens are already held).

Waiting: callers of one process queue FIFO and only the head asks the limiter, so N waiters cost one Redis
call per wait, not N. The head sleeps exactly the wait the algorithm returns (rate, tokens); a full
concurrency limit is rechecked when this process frees a slot or after `poll_seconds` (another replica's).
A wait longer than what is left of `max_wait_seconds` fails at once with `OverloadedError` and Retry-After.

Modules: `base` (the config, `Slot`, the `QuotaLimiter` protocol), `in_process` (the arithmetic in process
memory), `waiting` (the FIFO queue and the refusals), `local` and `redis` (the two limiters), and `lua/` (the
scripts Redis runs, package data).
"""

from __future__ import annotations

from gateway.quota.base import QuotaConfig, QuotaLimiter, Slot
from gateway.quota.local import LocalQuotaLimiter
from gateway.quota.redis import RedisQuotaLimiter
from gateway.redis_client import RedisConnection

__all__ = ["LocalQuotaLimiter", "QuotaConfig", "QuotaLimiter", "RedisQuotaLimiter", "Slot", "build_limiter"]


def build_limiter(
    config: QuotaConfig, redis: str | RedisConnection | None, *, name: str, key_name: str | None = None
) -> QuotaLimiter:
    """The shared limiter when Redis is configured (the quota is the account's), else the in-process one. `name`
    labels its metrics and messages; `key_name` (default: `name`) names its Redis keys."""
    if redis is None:
        return LocalQuotaLimiter(config, name=name)
    return RedisQuotaLimiter(redis, config, name=name, key_prefix=f"quota:{{{key_name or name}}}:")
