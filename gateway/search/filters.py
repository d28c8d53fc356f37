"""The metadata filter language (Mongo-style JSON, as Chroma and Pinecone take it), parsed into a small tree.

    {"lang": "zh"}                                 implicit $eq
    {"price": {"$gte": 10, "$lt": 100}}            several operators on one field: all must hold
    {"$or": [{"lang": "zh"}, {"tags": {"$in": ["a", "b"]}}]}

Operators: $eq $ne (a string, number or boolean), $gt $gte $lt $lte (a number), $in $nin (a non-empty list of
strings, numbers or booleans), $and $or (a non-empty list of filters). On a list-valued field (a list of
strings), $eq and $in match when the list holds the value, as in Mongo. A field that a document lacks matches
$ne and $nin and nothing else. Each engine compiles the tree into its own form (`qdrant_filter.py`,
`milvus_filter.py`) with the values as data, never spliced into query text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from gateway.errors import InvalidRequestError

Scalar: TypeAlias = str | int | float | bool
Comparison = Literal["$eq", "$ne", "$gt", "$gte", "$lt", "$lte"]
Membership = Literal["$in", "$nin"]
FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
RESERVED_PREFIX = "__"  # the gateway's own fields (a chunked collection's: `chunks.py`)
RANGE_OPERATORS = ("$gt", "$gte", "$lt", "$lte")
MAX_DEPTH = 8
MAX_CONDITIONS = 64
MIN_INT, MAX_INT = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class Compare:
    field: str
    op: Comparison
    value: Scalar


@dataclass(frozen=True)
class Member:
    field: str
    op: Membership
    values: tuple[Scalar, ...]


@dataclass(frozen=True)
class All:
    parts: tuple[Filter, ...]


@dataclass(frozen=True)
class Any_:
    parts: tuple[Filter, ...]


Filter: TypeAlias = Compare | Member | All | Any_


def parse_filter(raw: object, *, param: str = "filter") -> Filter:
    """The tree for `raw`; a malformed filter raises InvalidRequestError naming the field that is wrong."""
    counter = [0]
    return _parse(raw, param, counter, depth=0)


def check_field_name(name: str, where: str) -> None:
    if name.startswith(RESERVED_PREFIX):
        raise InvalidRequestError(
            f"{where}: metadata field names starting with {RESERVED_PREFIX} are the gateway's; got {name!r}",
            param=where.split(".", 1)[0],
        )
    if not FIELD_NAME.match(name):
        raise InvalidRequestError(
            f"{where}: metadata field names are letters, digits and _ (at most 64, not starting with a digit); "
            f"got {name!r}",
            param=where.split(".", 1)[0],
        )


def _parse(raw: object, where: str, counter: list[int], depth: int) -> Filter:
    if depth > MAX_DEPTH:
        raise _error(where, f"filters nest at most {MAX_DEPTH} levels of $and/$or, got {depth}")
    if not isinstance(raw, dict) or not raw:
        raise _error(where, f"a filter is a non-empty JSON object, got {_json_type(raw)}")
    parts: list[Filter] = []
    for key, value in raw.items():
        if key in ("$and", "$or"):
            parts.append(_logical(key, value, f"{where}.{key}", counter, depth))
        elif key.startswith("$"):
            raise _error(
                f"{where}.{key}",
                "unknown operator; fields take $eq $ne $gt $gte $lt $lte $in $nin, and filters combine with $and $or",
            )
        else:
            check_field_name(key, f"{where}.{key}")
            parts.extend(_field(key, value, f"{where}.{key}", counter))
    return parts[0] if len(parts) == 1 else All(tuple(parts))


def _logical(op: str, value: object, where: str, counter: list[int], depth: int) -> Filter:
    if not isinstance(value, list) or not value:
        raise _error(where, f"{op} takes a non-empty list of filters, got {_json_type(value)}")
    parts = tuple(_parse(item, f"{where}[{index}]", counter, depth + 1) for index, item in enumerate(value))
    return All(parts) if op == "$and" else Any_(parts)


def _field(field: str, value: object, where: str, counter: list[int]) -> list[Filter]:
    if not isinstance(value, dict):
        return [_compare(field, "$eq", value, where, counter)]
    if not value:
        raise _error(where, "an operator object needs at least one operator")
    conditions: list[Filter] = []
    for op, operand in value.items():
        at = f"{where}.{op}"
        if op in ("$eq", "$ne", *RANGE_OPERATORS):
            conditions.append(_compare(field, op, operand, at, counter))
        elif op in ("$in", "$nin"):
            conditions.append(_member(field, op, operand, at, counter))
        else:
            raise _error(at, "unknown operator; fields take $eq $ne $gt $gte $lt $lte $in $nin")
    return conditions


def _compare(field: str, op: Comparison, value: object, where: str, counter: list[int]) -> Compare:
    _count(counter, where)
    _check_range(value, where)
    if op in RANGE_OPERATORS:
        if not _is_number(value):
            raise _error(where, f"{op} compares with a number, got {_json_type(value)}")
    elif not _is_scalar(value):
        raise _error(where, f"{op} compares with a string, number or boolean, got {_json_type(value)}")
    return Compare(field, op, value)  # type: ignore[arg-type]


def _member(field: str, op: Membership, value: object, where: str, counter: list[int]) -> Member:
    _count(counter, where)
    if not isinstance(value, list) or not value:
        raise _error(where, f"{op} takes a non-empty list of strings, numbers or booleans, got {_json_type(value)}")
    if len(value) > MAX_CONDITIONS:
        raise _error(where, f"{op} takes at most {MAX_CONDITIONS} values, got {len(value)}")
    for index, item in enumerate(value):
        if not _is_scalar(item):
            raise _error(f"{where}[{index}]", f"{op} values are strings, numbers or booleans, got {_json_type(item)}")
        _check_range(item, f"{where}[{index}]")
    return Member(field, op, tuple(value))


def _count(counter: list[int], where: str) -> None:
    counter[0] += 1
    if counter[0] > MAX_CONDITIONS:
        raise _error(where, f"a filter holds at most {MAX_CONDITIONS} conditions")


def _check_range(value: object, where: str) -> None:
    """Integers are compared as 64-bit ones, as metadata keeps them (a larger one is not even a float)."""
    if isinstance(value, int) and not isinstance(value, bool) and not MIN_INT <= value <= MAX_INT:
        raise _error(where, f"integer {value} out of range [-2**63, 2**63-1]")


def _is_number(value: object) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and value == value and abs(value) != float("inf")
    )


def _is_scalar(value: object) -> bool:
    return isinstance(value, str | bool) or _is_number(value)


def _json_type(value: object) -> str:
    names: dict[type[Any], str] = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if _is_number(value):
        return "a number"
    return names.get(type(value), "a value of another type")


def _error(where: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"{where}: {message}", param=where.split(".", 1)[0].split("[", 1)[0])
