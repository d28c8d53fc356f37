"""The Hunyuan simulator's reasoning over real HTTP, as TokenHub documents it: who thinks by default, the thinking
switch, `reasoning_content` before the content, `reasoning_tokens` in the usage, `max_tokens` over both."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from simulators.hunyuan import echo_reply, reasoning_reply, split_pieces
from tests.helpers.hunyuan_fixtures import RunningHunyuanSimulator

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "hello 世界"}]
THOUGHTS = reasoning_reply(MESSAGES)


def complete(simulator: RunningHunyuanSimulator, http: httpx.Client, model: str, **fields: Any) -> httpx.Response:
    return http.post(f"{simulator.base_url}/chat/completions", json={"model": model, "messages": MESSAGES, **fields})


@pytest.mark.parametrize(
    ("model", "fields", "reasons"),
    [
        ("hy3-preview", {}, False),  # TokenHub: hy3-preview's thinking is off unless switched on
        ("hy3-preview", {"thinking": {"type": "enabled"}}, True),
        ("hy3-preview", {"reasoning_effort": "high"}, True),  # its slow thinking, asked for by effort
        ("hy3-preview", {"thinking": {"type": "disabled"}, "reasoning_effort": "high"}, False),
        ("deepseek-v4-flash", {}, True),
        ("deepseek-v4-flash", {"thinking": {"type": "disabled"}}, False),
        ("minimax-m2.7", {"thinking": {"type": "disabled"}}, True),  # cannot be switched off
        ("hy-mt2-pro", {"thinking": {"type": "enabled"}}, False),  # a translation model never thinks
    ],
)
def test_who_thinks_follows_the_switch_and_each_models_default(
    hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client, model: str, fields: dict[str, Any], reasons: bool
) -> None:
    answer = complete(hunyuan_simulator, http, model, **fields).json()
    message, usage = answer["choices"][0]["message"], answer["usage"]
    assert message["content"] == echo_reply(MESSAGES)
    assert message.get("reasoning_content") == (THOUGHTS if reasons else None)
    thought_tokens = len(split_pieces(THOUGHTS)) if reasons else 0
    assert usage.get("completion_tokens_details", {}).get("reasoning_tokens", 0) == thought_tokens
    assert usage["completion_tokens"] == len(split_pieces(echo_reply(MESSAGES))) + thought_tokens


def test_a_stream_sends_every_reasoning_piece_before_the_first_content(
    hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    response = complete(
        hunyuan_simulator, http, "hy3-preview", stream=True, thinking={"type": "enabled"},
        stream_options={"include_usage": True},
    )  # fmt: skip
    events = [line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    deltas = [json.loads(event)["choices"][0]["delta"] for event in events[:-2]]
    kinds = ["reasoning" if "reasoning_content" in d else "content" for d in deltas if d.get("content") or len(d) == 1]
    assert kinds == ["reasoning"] * len(split_pieces(THOUGHTS)) + ["content"] * len(split_pieces(echo_reply(MESSAGES)))
    assert "".join(d.get("reasoning_content", "") for d in deltas) == THOUGHTS
    assert json.loads(events[-2])["usage"]["completion_tokens_details"]["reasoning_tokens"] == kinds.count("reasoning")


def test_max_tokens_covers_the_reasoning_and_the_answer(
    hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    thought_pieces = len(split_pieces(THOUGHTS))
    cut = complete(hunyuan_simulator, http, "deepseek-v4-flash", max_tokens=thought_pieces + 2).json()
    assert cut["choices"][0]["finish_reason"] == "length"
    assert cut["usage"]["completion_tokens"] == thought_pieces + 2
    assert cut["choices"][0]["message"]["content"] == "".join(split_pieces(echo_reply(MESSAGES))[:2])


@pytest.mark.parametrize("fields", [{"thinking": {"type": "auto"}}, {"thinking": True}, {"reasoning_effort": 3}])
def test_a_malformed_switch_is_refused_with_tokenhubs_400(
    hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client, fields: dict[str, Any]
) -> None:
    response = complete(hunyuan_simulator, http, "hy3-preview", **fields)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["source"] == "client" and error["request_id"]
