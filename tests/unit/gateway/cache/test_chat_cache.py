from __future__ import annotations

from gateway.cache.chat import (
    ChatAnswer,
    ExactChatCache,
    TtlPolicy,
    chunks_to_completion,
    completion_to_chunks,
    exact_key,
    prompt_chars,
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


def test_the_thinking_switch_and_the_reasoning_effort_are_part_of_the_key() -> None:
    keys = {
        exact_key(body("hi")),
        exact_key(body("hi", thinking={"type": "enabled"})),
        exact_key(body("hi", thinking={"type": "disabled"})),
        exact_key(body("hi", thinking={"type": "enabled"}, reasoning_effort="high")),
        exact_key(body("hi", thinking={"type": "enabled"}, reasoning_effort="low")),
    }
    assert len(keys) == 5  # a reasoned answer never answers a request that turned reasoning off


def test_reasoning_an_assistant_turn_passes_back_counts_as_prompt() -> None:
    turn = {"role": "assistant", "content": "b", "reasoning_content": "x" * 10}
    assert prompt_chars({"messages": [turn]}) == len('"b"') + 10


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


async def test_only_normally_finished_answers_are_stored() -> None:
    cache = ExactChatCache(MemoryStore(1 << 20))
    cut = ChatAnswer(chunks=[chunk({"content": "par"}, "length")])
    done = ChatAnswer(chunks=[chunk({"content": "full"}, "stop")])
    stored_cut = await cache.put("k1", body("a"), cut)
    stored_done = await cache.put("k2", body("b"), done)
    found = await cache.get("k2")
    assert (stored_cut, stored_done) == (False, True)
    assert found is not None and found.as_completion()["choices"][0]["message"]["content"] == "full"


async def test_reasoning_is_kept_and_replayed_before_the_answer_both_ways() -> None:
    streamed = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "Think"}),
        chunk({"reasoning_content": "ing."}),
        chunk({"content": "Answer"}),
        chunk({}, "stop", usage={"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7,
                                 "completion_tokens_details": {"reasoning_tokens": 3}}),
    ]  # fmt: skip
    cache = ExactChatCache(MemoryStore(max_bytes=1 << 20))
    await cache.put("k", body("q"), ChatAnswer(chunks=streamed))
    stored = await cache.get("k")
    assert stored is not None and stored.as_chunks() == streamed  # a stream replays chunk for chunk
    completion = stored.as_completion()
    message = completion["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("Thinking.", "Answer")
    assert completion["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}
    replayed = completion_to_chunks(completion)  # a completion replayed as a stream: reasoning first
    deltas = [c["choices"][0]["delta"] for c in replayed if c["choices"]]
    assert replayed[-1]["choices"] == []  # the usage in a chunk of its own, as the upstream sends it
    assert deltas[0] == {"role": "assistant", "reasoning_content": "Thinking."}
    assert deltas[1] == {"content": "Answer"} and replayed[-1]["usage"] == completion["usage"]
    assert chunks_to_completion(replayed) == completion
