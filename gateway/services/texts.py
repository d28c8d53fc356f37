"""The checks every text a client sends for a model goes through (a search query, a document, a rerank pair)."""

from __future__ import annotations

from gateway.errors import InvalidRequestError, PayloadTooLargeError
from gateway.protocol.unicode import has_lone_surrogate, is_blank


def check_text(text: str, where: str, max_chars: int) -> None:
    """400 naming `where`'s field (`documents[3].text` -> `documents`) for a blank, invalid or over-long text."""
    param = where.split("[", 1)[0].split(".", 1)[0]
    if is_blank(text):
        raise InvalidRequestError(f"{where} is empty or has no visible character", param=param)
    if has_lone_surrogate(text):
        raise InvalidRequestError(f"{where} is not valid Unicode (a lone surrogate)", param=param)
    if len(text) > max_chars:
        raise InvalidRequestError(f"{where} has {len(text)} characters; the maximum is {max_chars}", param=param)


def check_count(count: int, param: str, maximum: int) -> None:
    """1 to `maximum` items in one call: none is a 400, too many a 413, each naming `param`."""
    if not count:
        raise InvalidRequestError(f"{param} must hold at least one item", param=param)
    if count > maximum:
        raise PayloadTooLargeError(f"{count} {param} in one call; the maximum is {maximum}", param=param)
