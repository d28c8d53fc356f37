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
    ("usage", "charged"),
    [
        ({"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42,
          "completion_tokens_details": {"reasoning_tokens": 20}}, 42),
        ({"prompt_tokens": 12, "completion_tokens": 10, "total_tokens": 42,
          "completion_tokens_details": {"reasoning_tokens": 20}}, 42),
        ({"prompt_tokens": 12, "completion_tokens": 10, "completion_tokens_details": {"reasoning_tokens": 20}}, 32),
    ],
    ids=["inside-completion", "in-the-total", "beside-completion"],
)  # fmt: skip
def test_reasoning_tokens_are_charged_to_the_token_budget(usage: dict[str, Any], charged: int) -> None:
    slot = RecordingSlot()
    account_usage("m", usage, slot)
    assert slot.settled == [charged]


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
    assert estimate_tokens({**body, "max_completion_tokens": 64}) == 100 + 64


@pytest.mark.parametrize(
    ("fields", "budget"),
    [
        ({"thinking": {"type": "enabled"}}, 2048),
        ({"reasoning_effort": "high"}, 2048),
        ({"thinking": {"type": "disabled"}, "reasoning_effort": "high"}, 512),
        ({"reasoning_effort": "none"}, 512),
        ({"thinking": {"type": "enabled"}, "max_tokens": 4096}, 4096),
    ],
)
def test_a_reasoning_answer_reserves_a_larger_budget_when_none_is_given(fields: dict[str, Any], budget: int) -> None:
    body = {"model": "hy3-preview", "messages": [{"role": "user", "content": "x" * 398}], **fields}
    assert estimate_tokens(body) == 100 + budget
