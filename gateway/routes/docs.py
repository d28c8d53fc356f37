"""GET /docs (Swagger UI) and /redoc (ReDoc), with every script, style and icon served by the gateway.

FastAPI's own pages load Swagger UI and ReDoc from a public CDN: blank in an air-gapped cluster and
unreliable from mainland China. The same files ship in the `fastapi-offline` package and are served
from under /docs/, which the API keys guard exactly as they guard /docs itself.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from gateway.routes import include

ASSETS_URL = "/docs/assets"
ASSETS_PACKAGE = ("fastapi_offline", "static")  # swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"  # FastAPI's default, kept so the routes stay the same

router = APIRouter(include_in_schema=False)


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    app, root = _app(request), _root_path(request)
    return get_swagger_ui_html(
        openapi_url=f"{root}{app.openapi_url}",
        title=f"{app.title} - Swagger UI",
        swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
        oauth2_redirect_url=f"{root}{OAUTH2_REDIRECT_URL}",
        init_oauth=app.swagger_ui_init_oauth,
        # No validator badge: Swagger UI would fetch it from validator.swagger.io, sending it the schema's URL.
        swagger_ui_parameters={**(app.swagger_ui_parameters or {}), "validatorUrl": None},
    )


@router.get(OAUTH2_REDIRECT_URL)
async def swagger_ui_oauth2_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    app, root = _app(request), _root_path(request)
    return get_redoc_html(
        openapi_url=f"{root}{app.openapi_url}",
        title=f"{app.title} - ReDoc",
        redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
        with_google_fonts=False,
    )


def _app(request: Request) -> FastAPI:
    app: FastAPI = request.app
    return app


def _root_path(request: Request) -> str:
    """The prefix a proxy serves the gateway under, as FastAPI's own pages use it."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def attach_router(app: FastAPI) -> None:
    """Replaces FastAPI's pages: create the app with `docs_url=None, redoc_url=None`."""
    include(app, router)
    app.mount(ASSETS_URL, StaticFiles(packages=[ASSETS_PACKAGE]), name="docs-assets")
