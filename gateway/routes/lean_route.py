"""A route FastAPI matches and documents, served without its per-request dependency machinery.

For a route whose work is short (one text to embed, a chat stream's way to its upstream), FastAPI's request
handling (two exit stacks, dependency solving, its own exception wrapper, the content type parsed per
request) costs more CPU than the rest of the request, and at a chat stream's start it is all on the way to
the upstream call. The endpoint takes `(body: <a RequestModel>, request: Request)` and returns a Response;
the body is read and validated here as FastAPI would (same content-type rules, same validation errors), and
exceptions go up to the app's exception handlers as before. OpenAPI still comes from the endpoint.
"""

from __future__ import annotations

import email.message
import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, get_type_hints

import orjson
from fastapi import HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.types import Receive, Scope, Send

from gateway.routes.nesting import check_nesting

M = TypeVar("M", bound=BaseModel)


class LeanRoute(APIRoute):
    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        self._body_model: type[BaseModel] = get_type_hints(endpoint)["body"]
        self._call: Callable[[BaseModel, Request], Awaitable[Response]] = endpoint

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] not in (self.methods or ()):
            await super().handle(scope, receive, send)  # 405, as FastAPI answers it
            return
        request = Request(scope, receive, send)
        body = parse_body(await request.body(), request.headers.get("content-type"), self._body_model)
        response = await self._call(body, request)
        await response(scope, receive, send)


def parse_body(raw: bytes, content_type: str | None, model: type[M]) -> M:
    """The body as FastAPI reads a JSON body parameter: JSON only with a JSON content type (its strict
    default), errors located under "body"."""
    data: Any = raw
    if not raw:
        missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
        raise RequestValidationError([missing], body=None)
    if content_type and is_json(content_type):
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:  # read again as FastAPI reads it: its errors, and what it accepts beyond
            check_nesting(raw)  # (orjson stops at 1,024 levels, where the standard library's parser recurses)
            data = _stdlib_json(raw)  # RFC 8259 (NaN, numbers beyond 64 bits, lone surrogates, UTF-16)
    try:
        return model.model_validate(data, from_attributes=True)
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=data) from exc


def _stdlib_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        error = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error", "input": {}}
        raise RequestValidationError([{**error, "ctx": {"error": exc.msg}}], body=exc.doc) from exc
    except Exception as exc:
        raise HTTPException(status_code=400, detail="There was an error parsing the body") from exc


@functools.lru_cache(maxsize=64)  # clients send the same few content types
def is_json(content_type: str) -> bool:
    """application/json or application/*+json, parameters aside (as FastAPI reads the header)."""
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))
