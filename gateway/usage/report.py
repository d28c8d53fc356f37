"""`GET /v1/usage`'s rows: the stored key x model x day counters summed over what is not grouped on, as JSON
rows or CSV. Only key prefixes appear, never a secret or its hash."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from datetime import date
from typing import Any

from gateway.errors import InvalidRequestError
from gateway.usage.record import COUNTERS
from gateway.usage.store import UsageRow

GROUPS = ("team", "key", "model")
MAX_DAYS = 366
_INTEGERS = frozenset(COUNTERS) - {"video_seconds", "cost"}


def parse_range(start: str, end: str) -> tuple[date, date]:
    try:
        first, last = date.fromisoformat(start), date.fromisoformat(end)
    except ValueError:
        raise InvalidRequestError(f"start and end must be dates as YYYY-MM-DD, got {start!r} and {end!r}") from None
    if last < first:
        raise InvalidRequestError(f"end {end} is before start {start}", param="end")
    if (last - first).days >= MAX_DAYS:
        raise InvalidRequestError(f"at most {MAX_DAYS} days per request, got {(last - first).days + 1}", param="end")
    return first, last


def parse_group_by(value: str | None) -> tuple[str, ...]:
    """`team`, `key`, `model` or a comma-separated combination; unset: all three."""
    if not value:
        return GROUPS
    groups = tuple(dict.fromkeys(part.strip() for part in value.split(",")))
    if unknown := [g for g in groups if g not in GROUPS]:
        raise InvalidRequestError(f"group_by: unknown {unknown}; expected team, key or model", param="group_by")
    return groups


def report(rows: Iterable[UsageRow], groups: tuple[str, ...]) -> list[dict[str, Any]]:
    totals: dict[tuple[str, ...], dict[str, Any]] = {}
    for row in rows:
        labels: dict[str, Any] = {}
        if "team" in groups or "key" in groups:
            labels["team"] = row.team  # a key belongs to one team
        if "key" in groups:
            labels["key_prefix"] = row.key_prefix
        if "model" in groups:
            labels["model"] = row.model
        labels["date"] = row.day
        group = (row.key_id if "key" in groups else "", *map(str, labels.values()))
        total = totals.setdefault(group, {**labels, **dict.fromkeys(COUNTERS, 0.0)})
        for name in COUNTERS:
            total[name] += row.counters.get(name, 0.0)
    result = []
    for total in totals.values():
        for name in _INTEGERS:
            total[name] = int(total[name])
        total["cost"] = round(total["cost"], 9)
        result.append(total)
    return sorted(result, key=lambda r: (r["date"], r.get("team", ""), r.get("key_prefix", ""), r.get("model", "")))


def to_csv(data: list[dict[str, Any]], groups: tuple[str, ...]) -> str:
    labels = [name for name in ("team", "key_prefix", "model") if _shown(name, groups)]
    out = io.StringIO()
    writer = csv.DictWriter(out, [*labels, "date", *COUNTERS], lineterminator="\n")
    writer.writeheader()
    writer.writerows(data)
    return out.getvalue()


def _shown(name: str, groups: tuple[str, ...]) -> bool:
    return {"team": "team" in groups or "key" in groups, "key_prefix": "key" in groups, "model": "model" in groups}[
        name
    ]
