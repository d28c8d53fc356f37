"""Text a request may not carry: lone surrogates, and texts with nothing visible in them.

JSON may escape a surrogate alone ("\\ud800"): Python decodes it to a string that UTF-8 cannot encode, so
the upstreams, the caches and SQLite would fail on it deep inside; such requests are refused with 400, when
the body is parsed (`base.RequestModel`). Error messages quote the place with the surrogate escaped (`printable`).
"""

from __future__ import annotations

import re
from typing import Any

from gateway.errors import InvalidRequestError, encodable

# Whitespace, control and format characters (zero-width spaces and joiners, BOM, soft hyphen, bidi
# marks, variation selectors, Hangul fillers): a text of only these has nothing for a model to read.
_INVISIBLE = re.compile(
    r"[\s\x00-\x1f\x7f-\x9f\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    r"\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0]*"
)


def has_lone_surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def is_blank(text: str) -> bool:
    """Whether `text` has no visible character (empty, whitespace, control or zero-width characters only)."""
    return _INVISIBLE.fullmatch(text) is not None


def printable(text: str) -> str:
    """`text` with each lone surrogate written as its escape (`\\ud800`): safe to quote in an error message,
    which is encoded as UTF-8 on its way to the client."""
    return encodable(text)


def dotted(path: tuple[str | int, ...]) -> str:
    """`("messages", 0, "content")` as `messages[0].content` (make it `printable` to quote it)."""
    where = ""
    for part in path:
        if isinstance(part, int):
            where += f"[{part}]"
        else:
            where += f".{part}" if where else part
    return where


def lone_surrogate_error(path: tuple[str | int, ...]) -> InvalidRequestError:
    """400 naming the place (`messages[0].content`), the surrogate itself written as its escape."""
    param = printable(str(path[0])) if path else None
    return InvalidRequestError(f"{printable(dotted(path))} is not valid Unicode (a lone surrogate)", param=param)


def lone_surrogate_at(value: Any) -> str | None:
    """Where (e.g. `messages[0].content`) the first string of a JSON value, key or value, holds a lone
    surrogate; None when none does. Iterative and linear at any depth: each place keeps only its parent's
    index and its own key, and the path is spelled out once, for the place found."""
    parents: list[tuple[int, str | int]] = [(-1, 0)]  # (parent's index, key), the root first
    pending: list[tuple[int, Any]] = [(0, value)]
    while pending:
        node, item = pending.pop()
        key = parents[node][1]
        if (isinstance(key, str) and has_lone_surrogate(key)) or (isinstance(item, str) and has_lone_surrogate(item)):
            return dotted(_path(parents, node))
        entries: list[tuple[str | int, Any]]
        if isinstance(item, dict):
            entries = [(str(name), child) for name, child in item.items()]
        elif isinstance(item, list):
            entries = list(enumerate(item))
        else:
            continue
        first = len(parents)
        parents.extend((node, name) for name, _ in entries)
        pending.extend((first + index, child) for index, (_, child) in reversed(list(enumerate(entries))))
    return None


def _path(parents: list[tuple[int, str | int]], node: int) -> tuple[str | int, ...]:
    keys: list[str | int] = []
    while node > 0:
        node, key = parents[node]
        keys.append(key)
    return tuple(reversed(keys))


def require_unicode(body: dict[str, Any]) -> None:
    """400 when any string of a request body (field names included) holds a lone surrogate. Request models
    (`base.RequestModel`) refuse these when they parse a body; this is for bodies built another way."""
    if (where := lone_surrogate_at(body)) is not None:
        field = printable(re.split(r"[.\[]", where, maxsplit=1)[0])
        raise InvalidRequestError(f"{printable(where)} is not valid Unicode (a lone surrogate)", param=field)
