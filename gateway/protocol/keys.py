"""Wire models of the admin API (`/v1/admin/keys`, `/v1/admin/teams/{team}`) and of `GET /v1/usage`."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from gateway.keys.model import KeyLimits, Scope
from gateway.protocol.base import RequestModel


class CreateKeyRequest(RequestModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, description="What the key is for, e.g. 'search-prod'.")
    team: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._-]+$", description="The owning team.")
    scopes: list[Scope] | None = Field(None, description="Route families the key may call; default: all but admin.")
    expires_at: datetime | None = Field(None, description="ISO 8601; the key is refused from then on (401).")
    limits: KeyLimits | None = None


class KeyObject(BaseModel):
    id: str
    prefix: str = Field(description="How logs and usage name the key: 'sk-…' and its last four characters.")
    name: str
    team: str
    scopes: list[str]
    limits: KeyLimits
    created_at: int
    expires_at: int | None
    revoked_at: int | None = None
    source: Literal["env", "file", "store"]

    @field_serializer("limits")
    def _set_limits_only(self, limits: KeyLimits) -> dict[str, Any]:
        return limits.model_dump(exclude_none=True)


class CreatedKey(KeyObject):
    key: str = Field(description="The secret, shown only in this answer: the gateway keeps its SHA-256 only.")


class KeyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[KeyObject]


class DeletedKey(BaseModel):
    id: str
    deleted: Literal[True] = True


class TeamLimitsRequest(RequestModel):
    model_config = ConfigDict(extra="forbid")

    limits: KeyLimits


class TeamObject(BaseModel):
    team: str
    limits: KeyLimits

    @field_serializer("limits")
    def _set_limits_only(self, limits: KeyLimits) -> dict[str, Any]:
        return limits.model_dump(exclude_none=True)
