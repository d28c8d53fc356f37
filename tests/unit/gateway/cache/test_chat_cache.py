from __future__ import annotations

import asyncio

from gateway.cache.chat import (
    ChatAnswer,
    ExactChatCache,
    TtlPolicy,
    chunks_to_completion,
    completion_to_chunks,
    exact_key,
)
from gateway.cache.memory import MemoryStore


def body(text: str, **extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def chunk(delta: dict[str, object], finish: str | None = None, **extra: object) -> dict[str, object]:
    return {
        "id": "c1",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


def test_key_ignores_delivery_fields_and_keeps_everything_else() -> None:
    assert exact_key(body("hi", stream=True, user="u1")) == exact_key(body("hi"))
    assert exact_key(body("hi", temperature=0.1)) != exact_key(body("hi", temperature=0.2))
    assert exact_key(body("hi", tools=[{"type": "function"}])) != exact_key(body("hi"))
    assert exact_key({"messages": [{"content": "hi", "role": "user"}], "model": "m"}) == exact_key(body("hi"))


def test_ttl_grows_with_the_prompt_and_is_capped() -> None:
    policy = TtlPolicy()
    assert policy.for_request(body("")) == 3600 + 10 * 2  # the JSON of an empty string is two characters
    assert policy.for_request(body("x" * 100)) == 3600 + 10 * 102
    assert policy.for_request(body("x" * 100_000)) == 24 * 3600


def test_chunks_aggregate_into_the_completion_and_back() -> None:
    chunks = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "你好"}),
        chunk({"tool_calls": [{"index": 0, "id": "t", "function": {"name": "f", "arguments": '{"a"'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
        chunk({}, "tool_calls", usage={"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}),
    ]
    completion = chunks_to_completion(chunks)
    message = completion["choices"][0]["message"]
    assert message["content"] == "你好" and message["tool_calls"][0]["function"] == {
        "name": "f",
        "arguments": '{"a": 1}',
    }
    assert completion["choices"][0]["finish_reason"] == "tool_calls" and completion["usage"]["total_tokens"] == 7
    replayed = chunks_to_completion(completion_to_chunks(completion))
    assert replayed["choices"] == completion["choices"] and replayed["usage"] == completion["usage"]


def test_only_normally_finished_answers_are_stored() -> None:
    async def scenario() -> tuple[bool, bool, ChatAnswer | None]:
        cache = ExactChatCache(MemoryStore(1 << 20))
        cut = ChatAnswer(chunks=[chunk({"content": "par"}, "length")])
        done = ChatAnswer(chunks=[chunk({"content": "full"}, "stop")])
        stored_cut = await cache.put("k1", body("a"), cut)
        stored_done = await cache.put("k2", body("b"), done)
        return stored_cut, stored_done, await cache.get("k2")

    stored_cut, stored_done, found = asyncio.run(scenario())
    assert (stored_cut, stored_done) == (False, True)
    assert found is not None and found.as_completion()["choices"][0]["message"]["content"] == "full"
