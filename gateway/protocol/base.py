"""`RequestModel`: the base of every request body, REST and gRPC alike.

JSON has no NaN or Infinity, yet Python's parser (FastAPI's) reads the literals `NaN`, `Infinity` and `-Infinity`,
and a number too large for a float (`1e400`) becomes infinity. Such a value is refused with the field's path
(`temperature`, `messages.0.content.1.x`), in declared fields and in the free-form ones that pass through to the
upstream alike, so the upstream is only ever sent strict JSON.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidatorFunctionWrapHandler, model_validator
from pydantic_core import InitErrorDetails


class RequestModel(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    @model_validator(mode="wrap")
    @classmethod
    def _finite_numbers_only(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        path = non_finite_path(data)
        if path is not None:
            error = InitErrorDetails(type="finite_number", loc=path, input=_at(data, path))
            raise ValidationError.from_exception_data(cls.__name__, [error])
        return handler(data)


def non_finite_path(value: Any) -> tuple[str | int, ...] | None:
    """Where the first NaN or infinity in `value` (dicts and lists, as parsed JSON) is; None when there is none.
    Iterative: a body nested as deep as the parser allows must not exhaust the stack here."""
    pending: list[tuple[tuple[str | int, ...], Any]] = [((), value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return path
        children: Any = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        pending.extend(((*path, key), child) for key, child in reversed(list(children)))
    return None


def _at(value: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        value = value[key]
    return value
