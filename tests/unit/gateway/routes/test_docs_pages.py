"""/docs and /redoc: the pages and everything they load come from the gateway, never from another host."""

from __future__ import annotations

import re

import httpx
import pytest
from pydantic import SecretStr

from gateway.app import create_app
from gateway.settings import AuthSettings, Settings

PAGES = ["/docs", "/redoc"]
LOADED = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")  # <script src>, <link href>
CSS_URL = re.compile(r"""url\(\s*["']?([^"')]+)""")
ASGI_ROOT_PATH = "/gateway"  # a proxy's prefix


async def fetch(
    paths: list[str], *, api_keys: str | None = None, bearer: str | None = None, root_path: str = ""
) -> list[httpx.Response]:
    """GET each path from the app (no lifespan: the pages need no upstream)."""
    settings = Settings(auth=AuthSettings(api_keys=SecretStr(api_keys))) if api_keys else Settings()
    transport = httpx.ASGITransport(app=create_app(settings), root_path=root_path)
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway", headers=headers) as client:
        return [await client.get(path) for path in paths]


def loaded_urls(html: str) -> list[str]:
    return LOADED.findall(html)


@pytest.mark.parametrize("page", PAGES)
async def test_the_page_answers_and_names_no_other_host(page: str) -> None:
    (response,) = await fetch([page])
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "http://" not in response.text and "https://" not in response.text
    assert "/openapi.json" in response.text
    urls = loaded_urls(response.text)
    assert urls, "the page loads its scripts from somewhere"
    assert all(url.startswith("/") and not url.startswith("//") for url in urls), urls


@pytest.mark.parametrize("page", PAGES)
async def test_every_asset_the_page_loads_is_served_by_the_gateway(page: str) -> None:
    (html,) = await fetch([page])
    urls = loaded_urls(html.text)
    for url, response in zip(urls, await fetch(urls), strict=True):
        assert response.status_code == 200, url
        assert response.content, url


async def test_the_stylesheet_loads_nothing_but_inline_data() -> None:
    (html,) = await fetch(["/docs"])
    (css,) = await fetch([url for url in loaded_urls(html.text) if url.endswith(".css")])
    assert css.status_code == 200
    urls = CSS_URL.findall(css.text)
    assert urls and all(url.startswith("data:") for url in urls)
    assert "@import" not in css.text


async def test_swagger_ui_does_not_call_the_online_validator() -> None:
    (response,) = await fetch(["/docs"])
    assert '"validatorUrl": null' in response.text


async def test_the_oauth2_redirect_page_fastapi_serves_is_kept() -> None:
    (response,) = await fetch(["/docs/oauth2-redirect"])
    assert response.status_code == 200


@pytest.mark.parametrize("page", PAGES)
async def test_behind_a_proxy_prefix_every_url_keeps_the_prefix(page: str) -> None:
    (response,) = await fetch([page], root_path=ASGI_ROOT_PATH)
    urls = [*loaded_urls(response.text), *re.findall(r"""["'](/[^"']*openapi\.json)["']""", response.text)]
    assert urls and all(url.startswith(f"{ASGI_ROOT_PATH}/") for url in urls), urls


async def test_with_api_keys_the_assets_are_guarded_exactly_as_the_pages() -> None:
    (html,) = await fetch(["/docs"])
    paths = [*PAGES, *loaded_urls(html.text)]
    without_key = await fetch(paths, api_keys="k")
    assert {response.status_code for response in without_key} == {401}
    with_key = await fetch(paths, api_keys="k", bearer="k")
    assert {response.status_code for response in with_key} == {200}
