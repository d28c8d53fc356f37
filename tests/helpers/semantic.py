"""What the semantic cache's tests build their cases from: chat bodies and SimHash similarity."""

from __future__ import annotations

from typing import Any

from gateway.cache.semantic.simhash import simhash64, simhash_similarity


def chat(text: str, **fields: Any) -> dict[str, Any]:
    """A chat request asking `text`; `earlier` (messages before it) and any other field may be given."""
    earlier = fields.pop("earlier", [])
    body = {"model": "glm-5", "temperature": 0.2, "messages": [*earlier, {"role": "user", "content": text}]}
    return body | fields


def similar(a: str, b: str) -> float:
    """The SimHash similarity of two texts."""
    return simhash_similarity(simhash64(a), simhash64(b))
