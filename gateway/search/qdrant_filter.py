"""A filter tree as Qdrant's filter objects: values go in as typed data, there is no query text to escape.

Metadata lives under the payload key `metadata`, so field `lang` is the path `metadata.lang` (field names are
checked to hold no dots or brackets). Numbers compare through ranges, so 3 and 3.0 are equal and a boolean
or string never equals a number, as in Mongo. Booleans are matched under the payload key `flags`, where the
store keeps them as 1 and 0 too: qdrant-edge-py 0.9 turns `MatchValue(True)` into the integer 1, which matches
no JSON `true`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qdrant_edge import FieldCondition, Filter, MatchValue, PayloadSchemaType, RangeFloat

from gateway.search import filters as f

METADATA = "metadata"
FLAGS = "flags"


def to_qdrant(where: f.Filter) -> Filter:
    condition = _condition(where)
    return condition if isinstance(condition, Filter) else Filter(must=[condition])


def _condition(where: f.Filter) -> Any:
    if isinstance(where, f.All):
        return Filter(must=[_condition(part) for part in where.parts])
    if isinstance(where, f.Any_):
        return Filter(should=[_condition(part) for part in where.parts])
    if isinstance(where, f.Member):
        equals: list[Any] = [_equals(where.field, value) for value in where.values]
        return Filter(should=equals) if where.op == "$in" else Filter(must_not=equals)
    if where.op == "$eq":
        return _equals(where.field, where.value)
    if where.op == "$ne":
        return Filter(must_not=[_equals(where.field, where.value)])
    bound = float(where.value)
    ranges = {"$gt": {"gt": bound}, "$gte": {"gte": bound}, "$lt": {"lt": bound}, "$lte": {"lte": bound}}
    return FieldCondition(_path(where.field), range=RangeFloat(**ranges[where.op]))


def _equals(field: str, value: f.Scalar) -> FieldCondition:
    if isinstance(value, bool):
        return FieldCondition(f"{FLAGS}.{field}", match=MatchValue(int(value)))
    if isinstance(value, str):
        return FieldCondition(_path(field), match=MatchValue(value))
    return FieldCondition(_path(field), range=RangeFloat(gte=float(value), lte=float(value)))


def _path(field: str) -> str:
    return f"{METADATA}.{field}"


def flags(metadata: Mapping[str, object]) -> dict[str, int]:
    """The boolean metadata as the `flags` payload the filters above match."""
    return {key: int(value) for key, value in metadata.items() if isinstance(value, bool)}


def payload_indexes(metadata: Mapping[str, object]) -> dict[str, PayloadSchemaType]:
    """The payload index each metadata field's filters use: keyword for strings and lists of strings, float for
    numbers, integer for the booleans kept under `flags`."""
    indexes = {}
    for key, value in metadata.items():
        if isinstance(value, bool):
            indexes[f"{FLAGS}.{key}"] = PayloadSchemaType.Integer
        elif isinstance(value, int | float):
            indexes[_path(key)] = PayloadSchemaType.Float
        else:
            indexes[_path(key)] = PayloadSchemaType.Keyword
    return indexes
