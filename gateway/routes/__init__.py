"""The REST routes, one module per API; each module's `attach_router(app)` adds its routes to the app."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI


def include(app: FastAPI, router: APIRouter) -> None:
    """The router's routes added to the app's own list. `app.include_router` keeps the router as one more layer,
    which matches every request that reaches it twice, on the way to each route; the routes themselves already
    carry the router's dependencies, tags and route class."""
    app.router.routes.extend(router.routes)
