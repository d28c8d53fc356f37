"""Non-finite numbers: where `non_finite_path` finds them, how `RequestModel` refuses them, and `strict_json`."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from gateway.protocol.base import non_finite_path
from gateway.protocol.chat import ChatCompletionRequest
from gateway.upstreams.pool import strict_json


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"a": 1.0, "b": [1, "x", None, True]}, None),
        (math.nan, ()),
        ({"a": {"b": [0.5, math.inf]}}, ("a", "b", 1)),
        ([{"x": 1}, {"y": -math.inf}, {"z": math.nan}], (1, "y")),  # the first one, in document order
    ],
)
def test_non_finite_path_names_the_first_non_finite_number(value: object, path: tuple[str | int, ...] | None) -> None:
    assert non_finite_path(value) == path


def test_non_finite_path_walks_deep_bodies_without_recursion() -> None:
    body: object = math.inf
    for _ in range(5000):
        body = [body]
    assert non_finite_path(body) == (0,) * 5000


def test_a_request_model_names_the_field_in_python_and_json_input() -> None:
    body = '{"model": "m", "messages": [{"role": "user", "content": "hi", "meta": {"w": NaN}}]}'
    with pytest.raises(ValidationError) as raised:
        ChatCompletionRequest.model_validate_json(body)
    (error,) = raised.value.errors()
    assert (error["type"], error["loc"]) == ("finite_number", ("messages", 0, "meta", "w"))
    with pytest.raises(ValidationError, match="temperature"):
        ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user"}], "temperature": math.inf})


def test_strict_json_refuses_what_is_not_json_and_writes_the_rest_compactly() -> None:
    assert strict_json({"t": 0.5, "text": "你好"}) == '{"t":0.5,"text":"你好"}'
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        strict_json({"t": math.nan})
