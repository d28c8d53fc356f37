"""`LeanRoute` reads a body as FastAPI's own route does: the same answers, errors included, for the same bytes
(with the gateway's error handlers, as in the app)."""

from __future__ import annotations

import json

import pytest
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.testclient import TestClient

from gateway.errors import install_error_handlers
from gateway.protocol.openai import EmbeddingRequest
from gateway.routes import include
from gateway.routes.lean_route import LeanRoute


async def echo(body: EmbeddingRequest, request: Request) -> Response:
    return Response(json.dumps(body.model_dump()), media_type="application/json")  # ASCII: lone surrogates too


def client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)
    lean = APIRouter(route_class=LeanRoute)
    lean.post("/lean")(echo)
    plain = APIRouter()
    plain.post("/plain")(echo)
    include(app, lean)
    include(app, plain)
    return TestClient(app)


BODIES = [
    b'{"input": "hi", "model": "bge"}',
    b'{"input": ["a", "b"], "input": "last wins"}',
    b'{"input": "lone \\ud800 surrogate"}',  # not UTF-8: orjson refuses it, the standard library reads it
    b'{"input": "x", "dimensions": 123456789012345678901234567890}',  # beyond 64 bits
    b'{"input": "x", "dimensions": NaN}',
    b'{"input": "x", "dimensions": 1e400}',
    '{"input": "utf-16"}'.encode("utf-16"),
    b'{"input": "x",}',
    b"[1, 2",
    b'"just a string"',
    b"",
    b"\xff\xfe\x00",
]


@pytest.mark.parametrize("raw", BODIES)
@pytest.mark.parametrize("content_type", ["application/json", "application/vnd.api+json; charset=utf-8", "text/plain"])
def test_a_body_gets_the_answer_fastapi_gives_it(raw: bytes, content_type: str) -> None:
    with client() as http:
        lean = http.post("/lean", content=raw, headers={"content-type": content_type})
        plain = http.post("/plain", content=raw, headers={"content-type": content_type})
    assert (lean.status_code, lean.json()) == (plain.status_code, plain.json())
