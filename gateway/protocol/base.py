"""`RequestModel`: the base of every request body, REST and gRPC alike.

Before any field is validated, one iterative walk over the parsed JSON (declared fields and the free-form ones
that pass through to the upstream alike) refuses, naming the place:

- nesting deeper than `MAX_NESTING_DEPTH` containers (the body itself is the first): later steps (the
  upstream's JSON encoder, the search stores, the filter compilers) recurse, so an unbounded depth would
  exhaust their stack;
- lone surrogates in strings and field names (`"\\ud800"`: JSON may escape one, Python decodes it to a string
  that UTF-8 cannot encode, so the upstreams, caches and stores would fail on it deep inside);
- NaN and infinities: JSON has none, yet Python's parser (FastAPI's) reads the literals `NaN`, `Infinity` and
  `-Infinity`, and a number too large for a float (`1e400`) becomes infinity; upstreams only get strict JSON.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidatorFunctionWrapHandler, model_validator
from pydantic_core import InitErrorDetails

from gateway.errors import InvalidRequestError
from gateway.protocol.unicode import dotted, has_lone_surrogate, lone_surrogate_error, printable

# Containers (objects and arrays) a body may nest, the body itself included. Generous for what clients send
# (a tool's JSON schema, a filter of 8 levels), and far below the encoders' limits (orjson's 255 levels).
MAX_NESTING_DEPTH = 64

Path = tuple[str | int, ...]


class RequestModel(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    @model_validator(mode="wrap")
    @classmethod
    def _strict_json_only(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        path = check_json(data)
        if path is not None:
            error = InitErrorDetails(type="finite_number", loc=path, input=_at(data, path))
            raise ValidationError.from_exception_data(cls.__name__, [error])
        return handler(data)


def check_json(value: Any) -> Path | None:
    """Raise InvalidRequestError at the first container nested too deep or string (value or field name) with a
    lone surrogate in `value` (dicts and lists, as parsed JSON); answer where its first NaN or infinity is
    (None: there is none), for the caller to report as pydantic's `finite_number` error.
    Iterative, so a body nested as deep as the parser allows cannot exhaust the stack here; depth-first, in
    document order."""
    pending: list[tuple[Path, Any]] = [((), value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, str):
            if has_lone_surrogate(item):
                raise lone_surrogate_error(path)
        elif isinstance(item, float):
            if not math.isfinite(item):
                return path
        elif isinstance(item, dict | list):
            if len(path) >= MAX_NESTING_DEPTH:
                raise too_deep_error(path)
            if isinstance(item, dict):
                for key in item:
                    if isinstance(key, str) and has_lone_surrogate(key):
                        raise lone_surrogate_error((*path, key))
                pending.extend(((*path, key), child) for key, child in reversed(item.items()))
            else:
                pending.extend(((*path, index), child) for index, child in reversed(list(enumerate(item))))
    return None


def too_deep_error(path: Path) -> InvalidRequestError:
    return InvalidRequestError(
        f"{printable(dotted(path))}: nested deeper than the maximum of {MAX_NESTING_DEPTH} levels",
        param=printable(str(path[0])) if path else None,
    )


def non_finite_path(value: Any) -> Path | None:
    """Where the first NaN or infinity in `value` (dicts and lists, as parsed JSON) is; None when there is none.
    Only that, at any depth (iterative); `check_json` is what request bodies go through."""
    pending: list[tuple[Path, Any]] = [((), value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return path
        children: Any = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        pending.extend(((*path, key), child) for key, child in reversed(list(children)))
    return None


def _at(value: Any, path: Path) -> Any:
    for key in path:
        value = value[key]
    return value
