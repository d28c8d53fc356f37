"""The admin API's logic, framework-free: create, list and revoke keys, set a team's limits. Each write goes to
the key store and is in force on this replica at once, on the others within GATEWAY_KEYS_REFRESH_SECONDS."""

from __future__ import annotations

import time
import uuid

from gateway.errors import ConflictError, NotFoundError, UpstreamUnavailableError
from gateway.keys.model import ALL_SCOPES, NO_LIMITS, ApiKey, KeyLimits, display_prefix, hash_secret, new_secret
from gateway.keys.resolver import KeyResolver
from gateway.keys.store import KeyStore

DEFAULT_SCOPES = ALL_SCOPES - {"admin"}  # admin rights are given on purpose, never by default


class KeyAdmin:
    def __init__(self, resolver: KeyResolver) -> None:
        self._resolver = resolver

    def _store(self) -> KeyStore:
        store = self._resolver.store
        if store is None:
            raise UpstreamUnavailableError("no key store is configured")
        return store

    async def create(
        self,
        *,
        name: str,
        team: str,
        scopes: list[str] | None,
        expires_at: float | None,
        limits: KeyLimits | None,
    ) -> tuple[ApiKey, str]:
        """The new key and its secret (returned once, never stored)."""
        secret = new_secret()
        key = ApiKey(
            id="key_" + uuid.uuid4().hex[:24],
            secret_hash=hash_secret(secret),
            prefix=display_prefix(secret),
            name=name,
            team=team,
            scopes=frozenset(scopes) if scopes is not None else DEFAULT_SCOPES,
            limits=limits or NO_LIMITS,
            created_at=time.time(),
            expires_at=expires_at,
        )
        await self._store().put_key(key)
        await self._resolver.refresh()
        return key, secret

    def list(self) -> list[ApiKey]:
        return sorted(self._resolver.keys(), key=lambda k: (k.team, k.created_at, k.id))

    async def revoke(self, key_id: str) -> ApiKey:
        """Revoked keys stay known, so that their callers are told so (401 'revoked') and usage keeps their team."""
        key = self._resolver.key(key_id)
        if key is None:
            raise NotFoundError(f"no API key with id {key_id!r}")
        if key.source != "store":
            where = "GATEWAY_API_KEYS" if key.source == "env" else "the keys file"
            raise ConflictError(f"API key {key_id!r} is defined in {where}; remove it there")
        if key.revoked_at is None:
            key = key.revoked(time.time())
            await self._store().put_key(key)
            await self._resolver.refresh()
        return key

    async def set_team_limits(self, team: str, limits: KeyLimits) -> KeyLimits:
        await self._store().put_team(team, limits)
        await self._resolver.refresh()
        return limits
