"""The keys file (YAML, e.g. mounted from a Kubernetes Secret): parsed into keys and team limits.

    teams:
      search:
        limits: {requests_per_minute: 600, monthly_budget: 50}
    keys:
      - name: search-prod
        team: search
        secret_sha256: 5e884898…      # or `secret: sk-…` (hashed on load, never kept)
        scopes: [embeddings, search]
        expires_at: 2027-01-01T00:00:00Z
        limits: {chat_tokens_per_minute: 20000}

A file that does not parse or validate raises `KeysFileError`, whose message never quotes the file (it holds
secrets): only the problem and its line.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.keys.model import ALL_SCOPES, ApiKey, KeyLimits, display_prefix, hash_secret, key_id_for, stored_scopes


class KeysFileError(ValueError):
    """The keys file (`GATEWAY_KEYS_FILE`) is not valid YAML or holds an invalid key or team entry; the keys in
    force stay (at start there are none from the file: the gateway stays closed rather than open).

    Do: operator: fix the entry the logged message names; the file is read again when it changes.
    """


@dataclass(frozen=True)
class KeysFile:
    keys: list[ApiKey]
    teams: dict[str, KeyLimits]


def parse_keys_file(text: str) -> KeysFile:
    try:
        document = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise KeysFileError(f"not valid YAML{where}: {getattr(exc, 'problem', None) or 'syntax error'}") from None
    if not isinstance(document, dict):
        raise KeysFileError("expected a mapping with 'keys' and 'teams' at the top")
    teams = {
        str(name): _limits(entry.get("limits") if isinstance(entry, dict) else None, f"team {name!r}")
        for name, entry in (document.get("teams") or {}).items()
    }
    entries = document.get("keys") or []
    if not isinstance(entries, list):
        raise KeysFileError("'keys' must be a list")
    return KeysFile([_key(entry, index) for index, entry in enumerate(entries)], teams)


def _key(entry: Any, index: int) -> ApiKey:
    where = f"keys[{index}]"
    if not isinstance(entry, dict) or not entry.get("name") or not entry.get("team"):
        raise KeysFileError(f"{where}: each key needs a 'name' and a 'team'")
    secret, digest = entry.get("secret"), entry.get("secret_sha256")
    if (secret is None) == (digest is None):
        raise KeysFileError(f"{where} ({entry['name']}): give exactly one of 'secret' and 'secret_sha256'")
    if not isinstance(secret or digest, str):  # YAML reads an unquoted all-digit value as a number
        raise KeysFileError(f'{where} ({entry["name"]}): quote the secret or its hash, e.g. secret_sha256: "…"')
    secret_hash = hash_secret(str(secret)) if secret else str(digest).lower()
    if len(secret_hash) != 64 or any(c not in "0123456789abcdef" for c in secret_hash):
        raise KeysFileError(f"{where} ({entry['name']}): 'secret_sha256' must be 64 hex digits")
    scopes = stored_scopes([str(s) for s in entry.get("scopes") or []])
    if unknown := scopes - ALL_SCOPES:
        raise KeysFileError(f"{where} ({entry['name']}): unknown scopes {sorted(unknown)}; known: {sorted(ALL_SCOPES)}")
    return ApiKey(
        id=str(entry.get("id") or key_id_for(secret_hash)),
        secret_hash=secret_hash,
        prefix=display_prefix(str(secret)) if secret else str(entry.get("prefix") or "sk-…"),
        name=str(entry["name"]),
        team=str(entry["team"]),
        scopes=scopes,
        limits=_limits(entry.get("limits"), where),
        created_at=0.0,
        expires_at=_epoch(entry.get("expires_at"), where),
        source="file",
    )


def _limits(raw: Any, where: str) -> KeyLimits:
    try:
        return KeyLimits.model_validate(raw or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise KeysFileError(f"{where}: limits.{field}: {first['msg']}") from None


def _epoch(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        moment = value
    else:
        try:
            moment = dt.datetime.fromisoformat(str(value))
        except ValueError:
            raise KeysFileError(f"{where}: expires_at must be an ISO 8601 time, got {value!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()
