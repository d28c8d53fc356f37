"""The admin API (admin scope): POST/GET /v1/admin/keys, DELETE /v1/admin/keys/{id}, PUT /v1/admin/teams/{team}."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Path, Request

from gateway.keys.admin import KeyAdmin
from gateway.keys.model import ApiKey
from gateway.protocol.keys import (
    CreatedKey,
    CreateKeyRequest,
    DeletedKey,
    KeyList,
    KeyObject,
    TeamLimitsRequest,
    TeamObject,
)
from gateway.protocol.openai import ErrorResponse
from gateway.routes import include
from gateway.routes.nesting import NestingLimitedRoute

router = APIRouter(route_class=NestingLimitedRoute)

ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 429, 503)}


def key_admin(request: Request) -> KeyAdmin:
    admin: KeyAdmin = request.app.state.key_admin
    return admin


@router.post("/v1/admin/keys", status_code=201, response_model=CreatedKey, responses=ERRORS)  # type: ignore[arg-type]
async def create_key(body: CreateKeyRequest, request: Request) -> CreatedKey:
    key, secret = await key_admin(request).create(
        name=body.name,
        team=body.team,
        scopes=list(body.scopes) if body.scopes is not None else None,
        expires_at=body.expires_at.timestamp() if body.expires_at is not None else None,
        limits=body.limits,
    )
    return CreatedKey(**key_object(key).model_dump(), key=secret)


@router.get("/v1/admin/keys", response_model=KeyList, responses=ERRORS)  # type: ignore[arg-type]
async def list_keys(request: Request) -> KeyList:
    return KeyList(data=[key_object(key) for key in key_admin(request).list()])


@router.delete("/v1/admin/keys/{key_id}", response_model=DeletedKey, responses=ERRORS)  # type: ignore[arg-type]
async def delete_key(request: Request, key_id: str = Path(max_length=100)) -> DeletedKey:
    key = await key_admin(request).revoke(key_id)
    return DeletedKey(id=key.id)


@router.put("/v1/admin/teams/{team}", response_model=TeamObject, responses=ERRORS)  # type: ignore[arg-type]
async def put_team(
    body: TeamLimitsRequest, request: Request, team: str = Path(max_length=100, pattern=r"^[A-Za-z0-9._-]+$")
) -> TeamObject:
    return TeamObject(team=team, limits=await key_admin(request).set_team_limits(team, body.limits))


def key_object(key: ApiKey) -> KeyObject:
    return KeyObject(
        id=key.id,
        prefix=key.prefix,
        name=key.name,
        team=key.team,
        scopes=sorted(key.scopes),
        limits=key.limits,
        created_at=int(key.created_at),
        expires_at=int(key.expires_at) if key.expires_at is not None else None,
        revoked_at=int(key.revoked_at) if key.revoked_at is not None else None,
        source=key.source,
    )


def attach_router(app: FastAPI) -> None:
    include(app, router)
