"""What a key is: its identity, scopes, limits and expiry; how a secret is made, hashed and shown in logs.

Standard library and pydantic only: no Redis, no FastAPI. A key's secret is never stored: only the SHA-256 of
it (`secret_hash`) and a prefix for people (`sk-…abcd`, the last four characters) are.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

Scope = Literal["embeddings", "chat", "video", "search", "rerank", "admin"]
ALL_SCOPES: frozenset[str] = frozenset(get_args(Scope))
# A key stored with every feature's scope of 0.2 (before `rerank`) could call every feature: it still can.
FEATURES_OF_0_2 = frozenset({"embeddings", "chat", "video", "search"})
# Route families a request is limited by (requests per minute) and needs the scope of.
Family = Literal["embeddings", "chat", "video", "search", "rerank", "admin", "models", "usage"]
SECRET_PREFIX = "sk-"
UNNAMED_TEAM = "default"  # the team of GATEWAY_API_KEYS' unnamed keys


class TokenBudget(BaseModel):
    """A monthly budget counted in tokens (chat prompt + completion, embedding and rerank tokens)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: int = Field(gt=0, description="Tokens per calendar month (UTC).")


class KeyLimits(BaseModel):
    """Limits of a key or of a team; unset fields do not limit. A key's and its team's limits both apply."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: int | dict[str, int] | None = Field(
        None,
        description="Requests per minute in each route family (one number for all, or per family, e.g. "
        '{"chat": 60}): up to N at once, then one more every 60/N s (a GCRA with a burst of N).',
    )
    chat_tokens_per_minute: int | None = Field(None, gt=0, description="Chat tokens per minute (estimate, settled).")
    concurrent_chat_streams: int | None = Field(None, gt=0, description="Chat completions in flight at once.")
    videos_per_day: int | None = Field(None, gt=0, description="Video tasks submitted per UTC day.")
    monthly_budget: float | TokenBudget | None = Field(
        None, description='Per UTC calendar month: a number in the price table\'s currency, or {"tokens": N}.'
    )

    @field_validator("requests_per_minute")
    @classmethod
    def _known_positive(cls, value: int | dict[str, int] | None) -> int | dict[str, int] | None:
        rates = value.values() if isinstance(value, dict) else [] if value is None else [value]
        if any(rate <= 0 for rate in rates):
            raise ValueError("requests per minute must be positive")
        if isinstance(value, dict) and (unknown := set(value) - set(get_args(Family))):
            raise ValueError(f"unknown route families {sorted(unknown)}; known: {sorted(get_args(Family))}")
        return value

    def rpm_for(self, family: str) -> int | None:
        rpm = self.requests_per_minute
        return rpm.get(family) if isinstance(rpm, dict) else rpm

    @property
    def is_empty(self) -> bool:
        return not any(value is not None for value in self.model_dump().values())


NO_LIMITS = KeyLimits()


@dataclass(frozen=True)
class ApiKey:
    """One key as the gateway knows it. `id` is public (admin API, usage); `secret_hash` is the lookup key."""

    id: str
    secret_hash: str
    prefix: str
    name: str
    team: str
    scopes: frozenset[str] = ALL_SCOPES
    limits: KeyLimits = NO_LIMITS
    created_at: float = field(default_factory=time.time)
    expires_at: float | None = None
    revoked_at: float | None = None
    source: Literal["env", "file", "store"] = "store"

    def refusal(self, now: float) -> str | None:
        """Why this key may not be used now (revoked, expired), or None."""
        if self.revoked_at is not None:
            return f"API key {self.prefix} was revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return f"API key {self.prefix} expired at {_iso(self.expires_at)}"
        return None

    def revoked(self, at: float) -> ApiKey:
        return replace(self, revoked_at=at)

    def to_record(self) -> dict[str, Any]:
        """The stored form (never holds the secret)."""
        return {
            "id": self.id,
            "secret_hash": self.secret_hash,
            "prefix": self.prefix,
            "name": self.name,
            "team": self.team,
            "scopes": sorted(self.scopes),
            "limits": self.limits.model_dump(exclude_none=True),
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any], source: Literal["env", "file", "store"] = "store") -> ApiKey:
        return cls(
            id=str(record["id"]),
            secret_hash=str(record["secret_hash"]),
            prefix=str(record["prefix"]),
            name=str(record["name"]),
            team=str(record["team"]),
            scopes=stored_scopes(record.get("scopes")),
            limits=KeyLimits.model_validate(record.get("limits") or {}),
            created_at=float(record.get("created_at") or 0.0),
            expires_at=_optional_float(record.get("expires_at")),
            revoked_at=_optional_float(record.get("revoked_at")),
            source=source,
        )


def new_secret() -> str:
    """A fresh secret: `sk-` and 43 URL-safe characters (256 random bits)."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    """The stored and looked-up form of a secret (hex SHA-256): a leaked store does not leak usable keys, and
    secrets are long and random, so no slow password hash is needed."""
    return hashlib.sha256(secret.encode()).hexdigest()


def display_prefix(secret: str) -> str:
    """How a key is named in logs, errors and usage: its scheme and last four characters, `sk-…abcd`."""
    head = SECRET_PREFIX if secret.startswith(SECRET_PREFIX) else ""
    return f"{head}…{secret[-4:]}" if len(secret) >= 12 else f"{head}…"


def key_id_for(secret_hash: str) -> str:
    """A stable public id for a key that has none of its own (GATEWAY_API_KEYS, a file entry without `id`):
    derived from the hash, so that replicas agree on it and usage survives restarts."""
    return "key_" + secret_hash[:16]


def stored_scopes(scopes: list[str] | None) -> frozenset[str]:
    """A stored key's scopes: none stored means all; every feature's scope of 0.2 gains `rerank`."""
    if not scopes:
        return ALL_SCOPES
    held = frozenset(scopes)
    return held | {"rerank"} if held >= FEATURES_OF_0_2 else held


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
