"""Reasoning models end to end: a real gateway (chat only) in front of the Hunyuan simulator speaking TokenHub's
reasoning (`reasoning_content` before the content, the thinking switch, `reasoning_tokens` in the usage)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import openai
import pytest
from pydantic import SecretStr

from gateway.grpc.pb.gateway.v1 import gateway_pb2 as pb
from gateway.grpc.pb.gateway.v1 import gateway_pb2_grpc as pb_grpc
from gateway.settings import ChatSettings
from simulators.hunyuan import echo_reply, reasoning_reply, split_pieces
from tests.helpers.hunyuan_fixtures import RunningHunyuanSimulator
from tests.helpers.running_gateway import RunningGateway

pytestmark = pytest.mark.slow

KEY = "sim-key-secret"
NO_TRITON = "127.0.0.1:9"  # chat does not need Triton
QUESTION = "Why is the sky blue?"
THINKING = {"type": "enabled"}


@pytest.fixture
def gateway(
    hunyuan_simulator: RunningHunyuanSimulator, gateway_factory: Callable[..., RunningGateway]
) -> RunningGateway:
    hunyuan_simulator.config.api_key = KEY
    settings = ChatSettings(base_url=hunyuan_simulator.base_url, api_key=SecretStr(KEY), retry_base_seconds=0.01)
    return gateway_factory(NO_TRITON, chat=settings)


@pytest.fixture
def client(gateway: RunningGateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=30) as made:
        yield made


def ask(text: str = QUESTION, **extra: Any) -> dict[str, Any]:
    return {"model": "hy3-preview", "messages": [{"role": "user", "content": text}], **extra}


def streamed(http: httpx.Client, gateway: RunningGateway, body: dict[str, Any]) -> tuple[str, list[Any]]:
    """(X-Cache, the SSE events decoded, ending with "[DONE]") of a streamed request."""
    response = http.post(f"{gateway.base_url}/v1/chat/completions", json={**body, "stream": True})
    assert response.status_code == 200, response.text
    payloads = [line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    return response.headers["x-cache"], [*map(json.loads, payloads[:-1]), "[DONE]"]


def reasoning_of(delta: Any) -> str | None:
    """`reasoning_content`, which the openai client keeps among a delta's extra fields."""
    extra = delta.model_extra or {}
    return extra.get("reasoning_content")


def test_the_openai_client_receives_the_reasoning_then_the_answer(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="hy3-preview",
        messages=[{"role": "user", "content": QUESTION}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"thinking": THINKING},
    )
    order: list[tuple[str, str]] = []
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            if thought := reasoning_of(choice.delta):
                order.append(("reasoning", thought))
            if choice.delta.content:
                order.append(("content", choice.delta.content))
    kinds = [kind for kind, _ in order]
    assert kinds == sorted(kinds, key=["reasoning", "content"].index) and "reasoning" in kinds  # thoughts first
    messages = [{"role": "user", "content": QUESTION}]
    assert "".join(text for kind, text in order if kind == "reasoning") == reasoning_reply(messages)
    assert "".join(text for kind, text in order if kind == "content") == echo_reply(messages)
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == len(split_pieces(reasoning_reply(messages)))


def test_a_reasoned_answer_is_cached_and_replayed_identically_streamed_and_not(
    gateway: RunningGateway, hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    body = ask(thinking=THINKING, reasoning_effort="high")
    cache, first = streamed(http, gateway, body)
    assert cache == "miss" and any("reasoning_content" in event["choices"][0]["delta"] for event in first[:-1])
    calls = hunyuan_simulator.stats.requests_total
    assert streamed(http, gateway, body) == ("hit", first)  # chunk for chunk, reasoning included
    completion = http.post(f"{gateway.base_url}/v1/chat/completions", json=body)
    assert completion.headers["x-cache"] == "hit"
    message = completion.json()["choices"][0]["message"]
    thoughts = "".join(event["choices"][0]["delta"].get("reasoning_content", "") for event in first[:-1])
    assert message["reasoning_content"] == thoughts == reasoning_reply(body["messages"])
    assert completion.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
    assert hunyuan_simulator.stats.requests_total == calls

    plain = ask("A non-streamed question first.", thinking=THINKING)
    answered = http.post(f"{gateway.base_url}/v1/chat/completions", json=plain)
    again = http.post(f"{gateway.base_url}/v1/chat/completions", json=plain)
    assert (answered.headers["x-cache"], again.headers["x-cache"]) == ("miss", "hit")
    assert again.json() == answered.json()
    cache, replayed = streamed(http, gateway, plain)
    deltas = [event["choices"][0]["delta"] for event in replayed[:-1]]
    assert (
        cache == "hit"
        and deltas[0]["reasoning_content"] == answered.json()["choices"][0]["message"]["reasoning_content"]
    )
    assert deltas[1]["content"] == answered.json()["choices"][0]["message"]["content"]  # after the reasoning


def test_the_thinking_switch_is_forwarded_and_part_of_the_cache_key(
    gateway: RunningGateway, hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    url = f"{gateway.base_url}/v1/chat/completions"
    enabled = http.post(url, json=ask(thinking=THINKING, reasoning_effort="low"))
    assert enabled.headers["x-cache"] == "miss" and "reasoning_content" in enabled.json()["choices"][0]["message"]
    assert hunyuan_simulator.stats.last_request is not None
    assert hunyuan_simulator.stats.last_request["thinking"] == THINKING
    assert hunyuan_simulator.stats.last_request["reasoning_effort"] == "low"
    for body in (ask(thinking={"type": "disabled"}, reasoning_effort="low"), ask()):  # hy3-preview's default: off
        answer = http.post(url, json=body)
        assert answer.headers["x-cache"] == "miss"
        assert "reasoning_content" not in answer.json()["choices"][0]["message"]
        assert "completion_tokens_details" not in answer.json()["usage"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("thinking", {"type": "on"}), ("thinking", "enabled"), ("reasoning_effort", "extreme")],
)
def test_a_bad_thinking_switch_or_effort_is_a_400_without_an_upstream_call(
    gateway: RunningGateway, hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client, field: str, value: Any
) -> None:
    answer = http.post(f"{gateway.base_url}/v1/chat/completions", json=ask(**{field: value}))
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == field and field in error["message"]
    assert hunyuan_simulator.stats.requests_total == 0


def test_the_semantic_cache_matches_conversations_whose_earlier_reasoning_differs(
    gateway: RunningGateway, hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    def conversation(thought: str, question: str) -> dict[str, Any]:
        earlier = [
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue.", "reasoning_content": thought},
        ]
        return {**ask(thinking=THINKING), "messages": [*earlier, {"role": "user", "content": question}]}

    url = f"{gateway.base_url}/v1/chat/completions"
    first = http.post(url, json=conversation("A colour: blue will do.", "Why is the sky blue?"))
    assert first.headers["x-cache"] == "miss"
    calls = hunyuan_simulator.stats.requests_total
    other = http.post(url, json=conversation("Thinking differently this time.", "Why is the sky blue?"))
    assert other.headers["x-cache"] == "semantic" and other.json() == first.json()
    assert hunyuan_simulator.stats.requests_total == calls


def test_grpc_chat_carries_the_reasoning_before_the_content(gateway: RunningGateway) -> None:
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        stub = pb_grpc.ChatStub(channel)
        body = ask("Reason over gRPC.", thinking=THINKING, stream_options={"include_usage": True})
        request = pb.ChatRequest(body_json=json.dumps(body))
        chunks = list(stub.Complete(request, timeout=30))
    kinds = ["reasoning" if c.reasoning_content else "content" for c in chunks if c.reasoning_content or c.content]
    assert kinds == sorted(kinds, key=["reasoning", "content"].index) and kinds[0] == "reasoning"
    messages = [{"role": "user", "content": "Reason over gRPC."}]
    assert "".join(c.reasoning_content for c in chunks) == reasoning_reply(messages)
    assert "".join(c.content for c in chunks) == echo_reply(messages)
    assert json.loads(chunks[-1].chunk_json)["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
