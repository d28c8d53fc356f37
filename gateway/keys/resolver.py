"""`KeyResolver`: from an `Authorization` header to the `ApiKey` it names, with one dict lookup per request.

Keys come from three sources, merged into one index by secret hash: GATEWAY_API_KEYS (unnamed, every scope),
the keys file and the key store (admin API). A background task keeps the index current: it looks at the keys
file's modification time and the store's version every `refresh_seconds` and reloads only what changed, so a
key created, changed or revoked on any replica is in force on every replica within that interval. A request
never waits for the store: an unknown key is refused from memory (and so causes no outbound work). A keys file
or a store that fails keeps the previous keys in force, and the reason is logged (once per failure streak).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from pathlib import Path

from gateway.auth import bearer_token
from gateway.background import cancel_and_wait
from gateway.errors import AuthenticationError, GatewayError
from gateway.keys.keys_file import KeysFileError, parse_keys_file
from gateway.keys.model import ALL_SCOPES, NO_LIMITS, UNNAMED_TEAM, ApiKey, KeyLimits, hash_secret, key_id_for
from gateway.keys.store import KeyStore, KeyStoreOutageError

log = logging.getLogger(__name__)

# The caller when no key is configured anywhere: every route is open but the admin API (keys are minted by an
# admin key, never by whoever reaches an open gateway), and usage is still recorded.
ANONYMOUS = ApiKey(
    id="anonymous",
    secret_hash="",
    prefix="-",
    name="anonymous",
    team=UNNAMED_TEAM,
    scopes=ALL_SCOPES - {"admin"},
    source="env",
)


def env_keys(secrets: list[bytes]) -> list[ApiKey]:
    """GATEWAY_API_KEYS as unnamed keys of the default team with every scope."""
    keys = []
    for secret in secrets:
        digest = hash_secret(secret.decode())
        prefix = f"…{secret.decode()[-4:]}" if len(secret) >= 12 else "…"
        keys.append(ApiKey(key_id_for(digest), digest, prefix, "", UNNAMED_TEAM, ALL_SCOPES, source="env"))
    return keys


class KeyResolver:
    def __init__(
        self,
        static_keys: list[ApiKey],
        *,
        keys_file: str | None = None,
        store: KeyStore | None = None,
        refresh_seconds: float = 0.25,
    ) -> None:
        if refresh_seconds <= 0:
            raise ValueError("refresh_seconds must be positive")
        self._static = static_keys
        self._file = Path(keys_file) if keys_file else None
        self._store = store
        self._refresh_seconds = refresh_seconds
        self._file_stamp: tuple[int, int, int] | None = None
        self._file_keys: list[ApiKey] = []
        self._file_teams: dict[str, KeyLimits] = {}
        self._store_version: str | None = None
        self._store_keys: list[ApiKey] = []
        self._store_teams: dict[str, KeyLimits] = {}
        self._failing: set[str] = set()
        self._by_hash: dict[str, ApiKey] = {}
        self._by_id: dict[str, ApiKey] = {}
        self._teams: dict[str, KeyLimits] = {}
        self._team_names: frozenset[str] = frozenset()
        self._enabled = False
        self._task: asyncio.Task[None] | None = None
        self._rebuild()

    @property
    def store(self) -> KeyStore | None:
        return self._store

    @property
    def enabled(self) -> bool:
        """False while no source holds a key and no keys file is configured: every route is then open. A keys
        file that does not load at start closes the gateway rather than opening it."""
        return self._enabled

    def resolve(self, authorization: str | None) -> ApiKey:
        """The key the header names, or `AuthenticationError` (missing, malformed, unknown, expired, revoked)."""
        if not self._enabled:
            return ANONYMOUS
        if not authorization:
            raise AuthenticationError("missing API key: send the header 'Authorization: Bearer <key>'")
        token = bearer_token(authorization)
        if not token:
            raise AuthenticationError("malformed Authorization header: expected 'Bearer <key>'")
        presented = hash_secret(token)
        key = self._by_hash.get(presented)
        # The lookup is by hash (a match reveals nothing about near misses); the comparison is constant-time.
        if key is None or not hmac.compare_digest(key.secret_hash, presented):
            raise AuthenticationError("invalid API key")
        if (refusal := key.refusal(time.time())) is not None:
            raise AuthenticationError(refusal, code="invalid_api_key")
        return key

    def key(self, key_id: str) -> ApiKey | None:
        return self._by_id.get(key_id)

    def keys(self) -> list[ApiKey]:
        return list(self._by_id.values())

    def team_limits(self, team: str) -> KeyLimits:
        return self._teams.get(team, NO_LIMITS)

    def teams(self) -> frozenset[str]:
        """Every team a configured key or team entry names: the bounded label set of the usage metrics."""
        return self._team_names

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._keep_current(), name="api-key-refresh")

    async def aclose(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task, name="API key refresh")

    async def refresh(self) -> None:
        """Reload whatever changed since the last look (also called right after an admin write)."""
        changed = await self._reload_file()
        changed = await self._reload_store() or changed
        if changed:
            self._rebuild()

    async def _keep_current(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_seconds)
            try:
                await self.refresh()
            except Exception:  # a bug here must not stop the refreshes for good
                log.exception("refreshing the API keys failed")

    async def _reload_file(self) -> bool:
        if self._file is None:
            return False
        try:
            status = self._file.stat()
        except OSError as exc:
            self._failed("file", f"keys file {self._file} unreadable ({exc.strerror}); the previous keys stay")
            return False
        # The inode too: a Kubernetes Secret volume swaps in a new file (symlink) rather than rewriting it.
        stamp = (status.st_mtime_ns, status.st_size, status.st_ino)
        if stamp == self._file_stamp:
            return False
        self._file_stamp = stamp
        try:
            text = await asyncio.to_thread(self._file.read_text, encoding="utf-8")
            parsed = parse_keys_file(text)
        except (OSError, UnicodeDecodeError, KeysFileError) as exc:
            self._failed("file", f"keys file {self._file} not loaded, the previous keys stay: {exc}", force=True)
            return False
        self._file_keys, self._file_teams = parsed.keys, parsed.teams
        self._recovered("file", f"keys file {self._file} loaded: {len(parsed.keys)} keys, {len(parsed.teams)} teams")
        return True

    async def _reload_store(self) -> bool:
        if self._store is None:
            return False
        try:
            if await self._store.version() == self._store_version:
                return False
            stored = await self._store.load()
        except GatewayError as exc:
            # A Redis outage is logged once by the Redis circuit, for all its users.
            level = logging.DEBUG if isinstance(exc, KeyStoreOutageError) else logging.WARNING
            self._failed("store", f"key store unreadable, the previous keys stay: {exc}", level=level)
            return False
        self._store_keys, self._store_teams, self._store_version = stored.keys, stored.teams, stored.version
        self._recovered("store", None)
        return True

    def _rebuild(self) -> None:
        # Later sources win: the store, then the file, then GATEWAY_API_KEYS.
        keys = [*self._store_keys, *self._file_keys, *self._static]
        self._by_hash = {key.secret_hash: key for key in keys}
        self._by_id = {key.id: key for key in keys}
        self._teams = {**self._file_teams, **self._store_teams}
        self._team_names = frozenset(self._teams) | {key.team for key in keys}
        self._enabled = bool(self._by_hash) or self._file is not None

    def _failed(self, source: str, message: str, *, force: bool = False, level: int = logging.WARNING) -> None:
        if force or source not in self._failing:
            log.log(level, message)
        self._failing.add(source)

    def _recovered(self, source: str, message: str | None) -> None:
        if message is not None:
            log.info(message)
        elif source in self._failing:
            log.info("key store readable again")
        self._failing.discard(source)
