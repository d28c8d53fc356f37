"""`GET /v1/usage`'s rows: sums over what is not grouped on, fields not grouped on absent, CSV columns alike."""

from __future__ import annotations

from datetime import date

import pytest

from gateway.errors import InvalidRequestError
from gateway.usage.record import COUNTERS, chat_usage
from gateway.usage.report import parse_group_by, parse_range, report, to_csv
from gateway.usage.store import UsageRow


def row(day: str, key_id: str, team: str, model: str, requests: int, cost: float) -> UsageRow:
    counters = {**dict.fromkeys(COUNTERS, 0.0), "requests": requests, "cost": cost}
    return UsageRow(day, key_id, f"sk-…{key_id[-4:]}", team, model, counters)


ROWS = [
    row("2026-12-01", "key_aaaa", "search", "hy3-preview", 2, 0.5),
    row("2026-12-01", "key_bbbb", "search", "bge", 3, 0.25),
    row("2026-12-01", "key_cccc", "ads", "bge", 1, 0.0),
]


def test_grouping_by_team_sums_its_keys_and_models() -> None:
    data = report(ROWS, parse_group_by("team"))
    assert [(r["team"], r["requests"], r["cost"]) for r in data] == [("ads", 1, 0.0), ("search", 5, 0.75)]
    assert all("key_prefix" not in r and "model" not in r for r in data)
    assert to_csv(data, ("team",)).splitlines()[0].startswith("team,date,requests,")


def test_grouping_by_model_and_all_groups() -> None:
    assert [(r["model"], r["requests"]) for r in report(ROWS, parse_group_by("model"))] == [
        ("bge", 4),
        ("hy3-preview", 2),
    ]
    every = report(ROWS, parse_group_by(None))
    assert len(every) == 3 and {"team", "key_prefix", "model", "date"} <= set(every[0])


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="unknown"):
        parse_group_by("user")
    with pytest.raises(InvalidRequestError, match="before start"):
        parse_range("2026-12-02", "2026-12-01")
    with pytest.raises(InvalidRequestError, match="YYYY-MM-DD"):
        parse_range("yesterday", "2026-12-01")
    assert parse_range("2026-12-01", "2026-12-01") == (date(2026, 12, 1), date(2026, 12, 1))


def test_chat_usage_reads_reasoning_tokens_and_counts_cache_hits_as_free() -> None:
    usage = chat_usage(
        {"prompt_tokens": 10, "completion_tokens": 30, "completion_tokens_details": {"reasoning_tokens": 12}},
        cached=False,
    )
    assert (usage.prompt_tokens, usage.completion_tokens, usage.reasoning_tokens) == (10, 30, 12)
    hit = chat_usage({"prompt_tokens": 10, "completion_tokens": 5}, cached=True)
    assert hit.cached_requests == 1 and hit.prompt_tokens == 0 and hit.saved_tokens == 15
