"""A filter tree as a Milvus boolean expression over the JSON field `metadata`.

Field names are checked to be identifiers before they get here, so `metadata["lang"]` cannot be broken out
of. Values are literals written by this module alone: numbers through `repr` of a float, booleans as
`true`/`false`, strings double-quoted with `\\`, `"` and line breaks escaped (the escapes both Milvus's parser
and Milvus Lite's accept). Milvus 2.5's `filter_params` would bind them as data instead, but Milvus Lite 3.2
rejects templates, and the tests run against it; the injection tests prove the escaping on both.

A list-valued field matches $eq and $in when it holds the value (`json_contains`), as in Mongo; a missing
field matches $ne and $nin, as in Mongo and in the embedded engine.
"""

from __future__ import annotations

from gateway.search import filters as f

METADATA = "metadata"
OPERATORS = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def to_milvus(where: f.Filter) -> str:
    if isinstance(where, f.All):
        return "(" + " and ".join(to_milvus(part) for part in where.parts) + ")"
    if isinstance(where, f.Any_):
        return "(" + " or ".join(to_milvus(part) for part in where.parts) + ")"
    if isinstance(where, f.Member):
        equals = " or ".join(_equals(where.field, value) for value in where.values)
        return f"({equals})" if where.op == "$in" else _absent_or_not(where.field, equals)
    if where.op == "$eq":
        return _equals(where.field, where.value)
    if where.op == "$ne":
        return _absent_or_not(where.field, _equals(where.field, where.value))
    return f"({_path(where.field)} {OPERATORS[where.op]} {literal(where.value)})"


def literal(value: f.Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.translate(ESCAPES) + '"'
    return repr(float(value))


def _equals(field: str, value: f.Scalar) -> str:
    path = _path(field)
    if isinstance(value, str):
        return f"({path} == {literal(value)} or json_contains({path}, {literal(value)}))"
    return f"({path} == {literal(value)})"


def _absent_or_not(field: str, condition: str) -> str:
    return f"((not exists {_path(field)}) or not ({condition}))"  # Milvus 2.3 parses the bare form wrongly


def _path(field: str) -> str:
    return f'{METADATA}["{field}"]'
