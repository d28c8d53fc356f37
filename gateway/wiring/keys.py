"""The keys, their limits and the usage record, built from the settings: Redis-backed when REDIS_URL is set
(shared by every replica, through the process's one `RedisConnection` and its circuit), else SQLite and
in-process state (one replica)."""

from __future__ import annotations

import time

from pydantic import SecretStr

from gateway.keys import names
from gateway.keys.admin import KeyAdmin
from gateway.keys.gatekeeper import Gatekeeper
from gateway.keys.limiter import KeyLimiter, LocalKeyLimiter, RedisKeyLimiter
from gateway.keys.resolver import KeyResolver, env_keys
from gateway.keys.store import build_key_store
from gateway.keys.watch_tokens import WatchTokens
from gateway.keys.watchers import DEFAULT_PER_KEY, KeyWatchers
from gateway.redis_client import RedisConnection
from gateway.settings import AuthSettings, UsageSettings
from gateway.usage.pricing import PriceTable
from gateway.usage.recorder import UsageRecorder
from gateway.usage.spool import UsageSpool
from gateway.usage.store import SqliteUsageStore, build_usage_store


class KeyServices:
    """Built when the app is (the middleware needs the gatekeeper); `start()` loads the keys and starts their
    refreshes, `aclose()` stops them and closes the stores. `redis` is the process's shared connection (None
    without REDIS_URL); `video_key` signs the watch tokens where GATEWAY_WATCH_TOKEN_SECRET is unset."""

    def __init__(
        self,
        auth: AuthSettings,
        usage: UsageSettings,
        redis: RedisConnection | None,
        *,
        watchers_per_key: int = DEFAULT_PER_KEY,
        video_key: SecretStr | None = None,
    ) -> None:
        self.resolver = KeyResolver(
            env_keys(auth.keys()),
            keys_file=auth.keys_file,
            store=build_key_store(redis, auth.keys_sqlite_path),
            refresh_seconds=auth.keys_refresh_seconds,
        )
        self.limiter: KeyLimiter = RedisKeyLimiter(redis) if redis else LocalKeyLimiter()
        self.gatekeeper = Gatekeeper(self.resolver, self.limiter, KeyWatchers(watchers_per_key))
        self.watch_tokens = WatchTokens.from_secrets(auth.watch_token_secret, video_key, auth.watch_token_seconds)
        self.admin = KeyAdmin(self.resolver)
        store = build_usage_store(redis, usage.usage_sqlite_path)
        spool = UsageSpool(usage.usage_spool_path, usage.usage_spool_max_records) if redis else None
        self.usage = UsageRecorder(store, PriceTable(usage.prices), self.limiter, self.resolver, spool)

    async def start(self) -> None:
        await self.resolver.start()
        store, limiter = self.usage.store, self.limiter
        if isinstance(store, SqliteUsageStore) and isinstance(limiter, LocalKeyLimiter):
            # In-process budgets start from this month's records, so a restart does not reset them.
            month = names.month_of(time.time())
            for subject, (cost, tokens) in (await store.month_spend(month)).items():
                await limiter.add_spend([names.spend_key(month, subject)], cost, tokens)
        self.usage.start()

    async def aclose(self) -> None:
        await self.resolver.aclose()
        await self.usage.aclose()
        await self.limiter.aclose()
        if self.resolver.store is not None:
            await self.resolver.store.aclose()
