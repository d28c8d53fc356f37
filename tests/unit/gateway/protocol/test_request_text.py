"""What a request may not carry (lone surrogates, texts with nothing visible), how its caller and its
Cache-Control are read, and how long an error message may be."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import Request

from gateway.auth import bearer_token, caller_identity
from gateway.errors import MAX_MESSAGE_CHARS, InvalidRequestError, NotFoundError
from gateway.protocol.unicode import is_blank, lone_surrogate_at, require_unicode
from gateway.routes.cache_control import cache_allowed


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "a\ud800"}]},
         "messages[1].content"),
        ({"prompt": "a cat", "negative_prompt": "\udfff"}, "negative_prompt"),
        ({"prompt": "a cat", "extra": {"nested": ["fine", {"deep": "x\ud83d"}]}}, "extra.nested[1].deep"),
        ({"prompt": "a cat", "k\udc00": 1}, "k\udc00"),
        ({"prompt": "a cat \U0001F431 猫", "n": 1, "ok": None, "list": [1.5, True]}, None),
    ],
    ids=["chat-content", "field", "nested", "key", "none"],
)  # fmt: skip
def test_lone_surrogate_at_names_the_first_place(body: dict[str, Any], where: str | None) -> None:
    assert lone_surrogate_at(body) == where


def test_require_unicode_is_a_400_naming_the_field() -> None:
    with pytest.raises(InvalidRequestError) as info:
        require_unicode({"model": "m", "messages": [{"role": "user", "content": "a\ud800"}]})
    assert info.value.param == "messages"
    assert info.value.message == "messages[0].content is not valid Unicode (a lone surrogate)"
    require_unicode({"prompt": "a real pair \U0001f431"})  # a surrogate pair in JSON is one real character


@pytest.mark.parametrize("text", ["", "  \n\t", "\x00", "\u200b\u200b", "\x01\x02", "\ufeff", "\u00ad", "\u3000"])
def test_texts_with_nothing_visible_are_blank(text: str) -> None:
    assert is_blank(text)


@pytest.mark.parametrize("text", ["a", " \u200bx", "猫", "\U0001f431", "0", "\x00.", "-"])
def test_texts_with_a_visible_character_are_not_blank(text: str) -> None:
    assert not is_blank(text)


@pytest.mark.parametrize(
    ("header", "token", "caller"),
    [
        ("Bearer key-1", "key-1", "key-1"),
        ("bearer  key-1 ", "key-1", "key-1"),
        ("BEARER key-1", "key-1", "key-1"),
        ("Basic dXNlcg==", "", "Basic dXNlcg=="),
        ("Bearer ", "", "Bearer"),
        (None, "", ""),
    ],
)
def test_a_caller_is_its_bearer_key_however_the_header_is_spelled(header: str | None, token: str, caller: str) -> None:
    assert bearer_token(header) == token
    assert caller_identity(header) == caller


def request_with(*cache_control: str) -> Request:
    headers = [(b"cache-control", value.encode()) for value in cache_control]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers})


@pytest.mark.parametrize(
    ("values", "allowed"),
    [
        ((), True),
        (("no-cache",), False),
        (("No-Cache",), False),
        (("max-age=0, NO-CACHE",), False),
        (('no-cache="set-cookie"',), False),
        (("max-age=0", "no-cache"), False),
        (("no-store",), True),
        (("max-age=0, no-cache-please",), True),
    ],
)
def test_cache_control_no_cache_is_a_case_insensitive_directive(values: tuple[str, ...], allowed: bool) -> None:
    assert cache_allowed(request_with(*values)) is allowed


def test_error_messages_quoting_a_huge_input_are_cut() -> None:
    short = NotFoundError("task 'abc' not found")
    assert short.message == "task 'abc' not found"
    long = NotFoundError(f"task {'a' * 10_000!r} not found")
    assert long.message.startswith("task 'aaa") and long.message.endswith(
        f"({10_000 + 17 - MAX_MESSAGE_CHARS} more characters)"
    )
    assert long.body()["error"]["message"] == long.message


def test_an_instance_code_overrides_the_class_code() -> None:
    assert InvalidRequestError("bad").body()["error"]["code"] is None
    assert InvalidRequestError("bad", code="model_not_found").body()["error"]["code"] == "model_not_found"
