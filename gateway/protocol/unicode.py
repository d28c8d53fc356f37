"""Text a request may not carry: lone surrogates, and texts with nothing visible in them.

JSON may escape a surrogate alone ("\\ud800"): Python decodes it to a string that UTF-8 cannot encode, so
the upstreams, the caches and SQLite would fail on it deep inside; such requests are refused with 400.
"""

from __future__ import annotations

import re
from typing import Any

from gateway.errors import InvalidRequestError

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


def lone_surrogate_at(value: Any, path: str = "") -> str | None:
    """Where (e.g. `messages[0].content`) the first string of a JSON value, key or value, holds a lone
    surrogate; None when none does."""
    if isinstance(value, str):
        return path if has_lone_surrogate(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if has_lone_surrogate(str(key)):
                return where
            if (found := lone_surrogate_at(item, where)) is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if (found := lone_surrogate_at(item, f"{path}[{index}]")) is not None:
                return found
    return None


def require_unicode(body: dict[str, Any]) -> None:
    """400 when any string of a request body (field names included) holds a lone surrogate."""
    if (where := lone_surrogate_at(body)) is not None:
        field = re.split(r"[.\[]", where, maxsplit=1)[0]
        raise InvalidRequestError(f"{where} is not valid Unicode (a lone surrogate)", param=field)
