"""Fault controls over HTTP, for a simulator running as its own process (`--control`): a soak changes its live
config while traffic flows and reads what it saw.

- `GET /_simulator/stats`: the stats, as JSON (counters and sets as objects and lists).
- `PATCH /_simulator/config`: a JSON object of config fields to change (e.g. `{"error_rate": 1.0}`); an unknown
  field, or a value of another JSON type than the field's, answers 400 and changes nothing. Answers the config.

Off by default: the real APIs have no such routes, and a client must not be able to change the upstream it tests.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.routing import Route

STATS_PATH = "/_simulator/stats"
CONFIG_PATH = "/_simulator/config"


def _plain(value: Any) -> Any:
    """`value` as JSON can carry it: dataclasses and counters as objects, sets and tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, Counter | dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, set | frozenset | tuple | list):
        return [_plain(item) for item in value]
    if callable(value):
        return None  # reply functions: not data
    return value


def _json_settable(config: object) -> dict[str, Any]:
    """The config's fields whose current value JSON can carry (numbers, strings, booleans, None, lists)."""
    plain = _plain(config)
    return {name: value for name, value in plain.items() if not callable(getattr(config, name))}


async def _stats(request: Request) -> JSONResponse:
    return JSONResponse(_plain(request.app.state.stats))


async def _config(request: Request) -> JSONResponse:
    config = request.app.state.config
    if request.method == "GET":
        return JSONResponse(_json_settable(config))
    try:
        changes = json.loads(await request.body() or b"{}")
    except ValueError:
        changes = None
    if not isinstance(changes, dict):
        return JSONResponse({"error": "expected a JSON object of config fields"}, 400)
    fields = {field.name: field for field in dataclasses.fields(config)}
    for name, value in changes.items():
        if name not in fields:
            return JSONResponse({"error": f"unknown config field {name!r}; known: {sorted(fields)}"}, 400)
        current = getattr(config, name)
        numbers = (int, float)
        same_type = (
            value is None
            or current is None
            or (isinstance(current, numbers) and not isinstance(current, bool) and isinstance(value, numbers))
            or type(value) is type(current)
        )
        if not same_type or isinstance(value, dict):
            return JSONResponse(
                {"error": f"{name}: expected {type(current).__name__}, got {type(value).__name__}"}, 400
            )
    for name, value in changes.items():
        setattr(config, name, float(value) if isinstance(getattr(config, name), float) else value)
    return JSONResponse(_json_settable(config))


def add_control_routes(app: FastAPI) -> None:
    """Put the control routes first, ahead of catch-all routes (the fal queue's submit takes any POST path)."""
    app.router.routes.insert(0, Route(STATS_PATH, _stats, methods=["GET"]))
    app.router.routes.insert(0, Route(CONFIG_PATH, _config, methods=["GET", "PATCH"]))
