"""docs/errors.md is generated from the error classes and cannot drift; the pure-ASGI middlewares answer errors
through `send_error`, with the answer FastAPI's exception handlers give."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr
from starlette.testclient import TestClient
from starlette.types import Receive, Scope, Send

from gateway.app import create_app
from gateway.errors import AuthenticationError, UpstreamUnavailableError, send_error
from gateway.errors_doc import DOCUMENT, docstring_parts, error_classes, main, raised_codes, render
from gateway.settings import AuthSettings, LimitSettings
from gateway.upstreams.webhooks import WebhookSignatureError
from tests.helpers.running_gateway import gateway_settings, scratch_dir

API_KEY = "sk-errors-doc-test-0001"
MAX_BODY_BYTES = 1000


def test_errors_document_matches_the_error_classes() -> None:
    assert DOCUMENT.read_text(encoding="utf-8") == render(), (
        "docs/errors.md drifted from the error classes: run `python -m gateway.errors_doc`"
    )


def test_every_error_class_says_when_it_happens_and_what_to_do() -> None:
    missing = [cls.__name__ for cls in error_classes() if not all(docstring_parts(cls))]
    assert missing == [], "each needs a docstring: a first paragraph (when), then a paragraph 'Do: ...'"


def test_error_class_names_are_unique() -> None:
    """The codes of raise sites are found by class name."""
    names = [cls.__name__ for cls in error_classes()]
    assert len(names) == len(set(names))


def row(name: str) -> str:
    return next(line for line in render().splitlines() if line.startswith(f"| `{name}` |"))


def test_rows_carry_the_statuses_type_and_codes() -> None:
    limited = "| `RateLimitExceededError` | 429 | `RESOURCE_EXHAUSTED` | `rate_limit_error` | `rate_limit_exceeded` |"
    assert row("RateLimitExceededError").startswith(limited)
    assert row("AuthenticationError").startswith(
        "| `AuthenticationError` | 401 | `UNAUTHENTICATED` | `authentication_error` | `invalid_api_key` |"
    )
    assert row("PayloadTooLargeError").startswith("| `PayloadTooLargeError` | 413 | `INVALID_ARGUMENT` |")
    # ConflictError has no code of its own; its raise sites give theirs.
    assert "| `null`, `collection_needs_reindex`, `collection_reindexing`," in row("ConflictError")


def test_rows_go_by_http_status_then_name() -> None:
    classes = error_classes()
    assert classes == sorted(classes, key=lambda cls: (cls.status_code, cls.__name__))
    assert len(classes) > 30  # every module was imported, not only those this test imports


class DocumentedError(Exception):
    """It happens when
    this and that.

    Do: retry | later.

    A note for readers of the code, not published.
    """


class UndocumentedError(Exception):
    """Only when."""


def test_docstring_parts_are_the_first_paragraph_and_the_do_paragraph() -> None:
    assert docstring_parts(DocumentedError) == ("It happens when this and that.", "retry | later.")
    assert docstring_parts(UndocumentedError) == ("Only when.", "")
    assert docstring_parts(type("Bare", (Exception,), {})) == ("", "")


def test_raised_codes_are_the_literal_code_arguments(tmp_path: Path) -> None:
    (tmp_path / "raises.py").write_text(
        "raise ConflictError('a', code='first')\n"
        "raise errors.ConflictError('b', code='second', param='p')\n"
        "raise NotFoundError('c', code=variable)\n",
        encoding="utf-8",
    )
    assert raised_codes(tmp_path) == {"ConflictError": {"first", "second"}}


def test_check_fails_on_a_stale_document_and_passes_on_a_fresh_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = tmp_path / "errors.md"
    assert main(["--check", "--output", str(document)]) == 1  # missing
    document.write_text(render() + "stale\n", encoding="utf-8")
    assert main(["--check", "--output", str(document)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert main(["--output", str(document)]) == 0
    assert main(["--check", "--output", str(document)]) == 0


def test_every_401_carries_www_authenticate() -> None:
    assert AuthenticationError("no key").headers == {"WWW-Authenticate": "Bearer"}
    assert WebhookSignatureError("unsigned").headers == {"WWW-Authenticate": "Bearer"}
    error = AuthenticationError("no key", headers={"X-Extra": "1"})
    assert error.headers == {"WWW-Authenticate": "Bearer", "X-Extra": "1"}
    assert AuthenticationError("again").headers == {"WWW-Authenticate": "Bearer"}  # the class's copy untouched


def test_send_error_answers_as_the_exception_handlers_do(caplog: pytest.LogCaptureFixture) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        error = UpstreamUnavailableError("store down", detail="redis://10.0.0.7 refused", code="store_down")
        await send_error(error, scope, receive, send)

    caplog.set_level(logging.WARNING, logger="gateway.errors")
    response = TestClient(app).get("/v1/things")
    assert response.status_code == 503
    assert response.json() == {
        "error": {"message": "store down", "type": "service_unavailable", "param": None, "code": "store_down"}
    }
    assert "10.0.0.7" not in response.text
    assert "GET /v1/things answered 503: store down: redis://10.0.0.7 refused" in caplog.text


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    data = scratch_dir("errors-doc-")
    auth = AuthSettings(api_keys=SecretStr(API_KEY), keys_sqlite_path=str(data / "keys.sqlite3"))
    limits = LimitSettings(max_body_bytes=MAX_BODY_BYTES)
    settings = gateway_settings("127.0.0.1:9", auth=auth, limits=limits)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_key_middleware_answers_401_with_www_authenticate_and_the_openai_body(client: TestClient) -> None:
    response = client.post("/v1/embeddings", json={"input": "hi"})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json() == {
        "error": {
            "message": "missing API key: send the header 'Authorization: Bearer <key>'",
            "type": "authentication_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_limits_middleware_answers_413_with_the_documented_body(client: TestClient, chunked: bool) -> None:
    body = b"x" * (MAX_BODY_BYTES + 1)
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    response = client.post("/v1/embeddings", content=iter([body]) if chunked else body, headers=headers)
    assert response.status_code == 413
    error = response.json()["error"]
    assert error == {
        "message": f"request body of {MAX_BODY_BYTES + 1} bytes exceeds the limit of {MAX_BODY_BYTES} bytes",
        "type": "invalid_request_error",
        "param": None,
        "code": "payload_too_large",
    }
    assert "www-authenticate" not in response.headers
