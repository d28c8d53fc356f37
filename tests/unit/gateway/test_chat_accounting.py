"""What a chat answer's usage does to its quota slot."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.services.chat import account_usage, estimate_tokens


class RecordingSlot:
    def __init__(self) -> None:
        self.settled: list[int] = []

    def settle(self, actual_tokens: int) -> None:
        self.settled.append(actual_tokens)


def test_reported_usage_settles_the_slot_with_the_billed_tokens() -> None:
    slot = RecordingSlot()
    account_usage("m", {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42}, slot)
    assert slot.settled == [42]


@pytest.mark.parametrize(
    "usage", [{}, {"total_tokens": 42}, {"prompt_tokens": "12"}], ids=["none", "total-only", "not-a-count"]
)
def test_an_answer_without_usage_keeps_its_estimate_charged(usage: dict[str, Any]) -> None:
    slot = RecordingSlot()
    account_usage("m", usage, slot)
    assert slot.settled == []  # settling with 0 would give the whole reservation back


def test_the_estimate_is_the_prompt_plus_the_answer_budget() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 398}]}  # 400 characters as JSON
    assert estimate_tokens(body) == 100 + 512
    assert estimate_tokens({**body, "max_tokens": 64}) == 100 + 64
