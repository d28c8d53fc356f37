"""`NestingLimitedRoute`: a route whose JSON body is refused, naming the place, when it nests deeper than
`MAX_NESTING_DEPTH`, before FastAPI parses it.

`RequestModel` names such a place once the body is parsed; but Python's JSON parser recurses, and a body
nested some thousand levels deep exhausts its stack, which FastAPI answers with a 400 naming nothing ("There
was an error parsing the body"). Here the raw body is measured first: a count of brackets clears most bodies at
once; only a body with more brackets than the limit is scanned (its strings skipped), and only a body nested
too deep is scanned again for the path to its first container past the limit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from gateway.protocol.base import MAX_NESTING_DEPTH, too_deep_error

_STRING = rb'"(?:[^"\\]|\\.)*"'
_STRINGS = re.compile(_STRING)
_TOKENS = re.compile(_STRING + rb"|[\[\]{},:]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
OPENERS = frozenset(b"[{")
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class NestingLimitedRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            if request.method in BODY_METHODS:
                check_nesting(await request.body())  # the request keeps the body for FastAPI to read
            return await handler(request)

        return checked


def check_nesting(raw: bytes) -> None:
    """400 naming the first container (object or array) of the JSON text `raw` nested deeper than
    `MAX_NESTING_DEPTH` (the body itself is the first), as `RequestModel` names it."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_NESTING_DEPTH:
        return
    depth = 0
    for byte in _STRINGS.sub(b"", raw).translate(None, _NOT_BRACKETS):
        depth += 1 if byte in OPENERS else -1
        if depth > MAX_NESTING_DEPTH:
            raise too_deep_error(_path_past_limit(raw))


def _path_past_limit(raw: bytes) -> tuple[str | int, ...]:
    """Where the first container past the limit sits: each open container's key or index leading to it."""
    path: list[str | int] = []
    arrays: list[bool] = []
    string = b'""'
    for match in _TOKENS.finditer(raw):
        token = match.group()
        if token[:1] == b'"':
            string = token
        elif token in (b"[", b"{"):
            if len(arrays) == MAX_NESTING_DEPTH:
                break
            arrays.append(token == b"[")
            path.append(0 if token == b"[" else "")
        elif token in (b"]", b"}"):
            if arrays:
                arrays.pop()
                path.pop()
        elif token == b":" and path:
            path[-1] = _key(string)
        elif token == b"," and arrays and arrays[-1]:
            path[-1] = int(path[-1]) + 1
    return tuple(path)


def _key(token: bytes) -> str:
    """A field name's JSON text (`"a\\u00e9"`) as the parser reads it."""
    try:
        key = json.loads(token)
    except ValueError:
        return token[1:-1].decode("utf-8", "replace")
    return key if isinstance(key, str) else str(key)
