"""What is compared (the last user text) and what must be equal (the context: earlier turns, numbers, polarity)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from gateway.cache.semantic.context import query_negated, query_numbers, semantic_context_key, semantic_query
from tests.helpers.semantic import chat


def test_context_key_is_equal_for_paraphrased_last_turns() -> None:
    assert semantic_context_key(chat("How do I reset my password?")) == semantic_context_key(
        chat("What is the way to reset my password?")
    )


def test_context_key_ignores_delivery_fields() -> None:
    plain = chat("hi")
    delivered = chat("hello", stream=True, stream_options={"include_usage": True}, user="u-1")
    assert semantic_context_key(plain) == semantic_context_key(delivered)


@pytest.mark.parametrize(
    "other",
    [
        chat("hi", model="deepseek-v4-pro"),
        chat("hi", temperature=0.9),
        chat("hi", top_p=0.5),
        chat("hi", earlier=[{"role": "system", "content": "Answer in French."}]),
        chat("hi", earlier=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]),
        chat("hi") | {"messages": [{"role": "user", "content": "hi", "name": "bob"}]},
        chat("hi", thinking={"type": "enabled"}),
        chat("hi", reasoning_effort="high"),
    ],
)
def test_context_key_differs_for_model_sampling_and_earlier_turns(other: dict[str, Any]) -> None:
    assert semantic_context_key(chat("hi")) != semantic_context_key(other)


def test_context_key_needs_all_earlier_turns_identical() -> None:
    first = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    changed = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "B"}]
    assert semantic_context_key(chat("q", earlier=first)) == semantic_context_key(chat("Q?", earlier=first))
    assert semantic_context_key(chat("q", earlier=first)) != semantic_context_key(chat("q", earlier=changed))


def test_context_key_leaves_out_the_reasoning_earlier_turns_pass_back() -> None:
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    thought = [turns[0], {**turns[1], "reasoning_content": "The user says a; I answer b."}]
    other_thought = [turns[0], {**turns[1], "reasoning_content": "Something else entirely."}]
    key = semantic_context_key(chat("q", earlier=turns))
    assert (
        semantic_context_key(chat("Q?", earlier=thought))
        == key
        == semantic_context_key(chat("q", earlier=other_thought))
    )
    assert semantic_query(chat("q", earlier=thought)) == "q"  # the compared text is the question alone


def test_questions_with_other_numbers_never_share_a_context() -> None:
    """Near-identical texts (SimHash 0.95 here), different questions: no answer may serve the other."""
    asked = chat("What is 12345 * 6789? Show the steps.")
    assert semantic_context_key(asked) != semantic_context_key(chat("What is 12345 * 6788? Show the steps."))
    assert semantic_context_key(asked) != semantic_context_key(chat("What is 6789 * 12345? Show the steps."))
    assert semantic_context_key(asked) == semantic_context_key(chat("Compute 12,345 * 6789, showing the steps."))
    assert query_numbers("Between 1,500 and 2.5, or 3") == ["1500", "2.5", "3"]
    assert query_numbers("the sum of 1,2 and 3,5; 12 and 3,456,789") == ["1,2", "3,5", "12", "3456789"]


@pytest.mark.parametrize(
    ("plain", "negated"),
    [
        ("How do I enable two-factor login?", "How do I not enable two-factor login?"),
        ("Why can I log in from my phone?", "Why can't I log in from my phone?"),
        ("为什么能登录", "为什么不能登录"),
        ("我有账号怎么办", "我没有账号怎么办"),
    ],
)
def test_negated_and_plain_questions_never_share_a_context(plain: str, negated: str) -> None:
    assert semantic_context_key(chat(plain)) != semantic_context_key(chat(negated))


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("How do I not enable two-factor login?", "How do I never enable two-factor login?"),
        ("Why can't I log in?", "Why am I never able to log in?"),
        ("How do I log in without a phone?", "How do I log in when I have no phone?"),
        ("Why can’t I log in?", "why cant i log in"),
        ("为什么不能登录", "为什么无法登录"),
        ("为什么没法登录", "为什么登录不了"),
        ("我必须去，要带什么", "我不得不去，要带什么"),  # a double negation is plain
        ("A和B有什么区别？", "A和B有什么不同？"),  # 不同 does not negate
    ],
)
def test_different_negations_of_a_question_share_a_context(first: str, second: str) -> None:
    assert semantic_context_key(chat(first)) == semantic_context_key(chat(second))


@pytest.mark.parametrize(
    "text",
    [
        "I don't want to not go: what do I pack?",  # two negations
        "我不得不去，要带什么",  # 不得不: must
        "Not only the app but the website: how do I log in?",
        "No matter what, how do I log in? See No. 2",
        "是不是要登录？能不能登录？有没有人知道？",  # A-not-A: yes-or-no questions
        "瑞士军刀能带上火车不？",  # clause-final 不: a question particle
        "这部电影非常不错，不同版本有什么区别，别人怎么说",  # 非常, 不错, 不同, 区别, 别人
        "无线网络无论如何都连得上吗",  # 无线, 无论
    ],
)
def test_double_negations_and_words_that_do_not_negate_keep_polarity(text: str) -> None:
    assert not query_negated(text)


def test_neither_nor_is_one_negation() -> None:
    assert query_negated("Why can neither the app nor the website log me in?")


def test_plain_questions_keep_the_context_key_of_before_polarity() -> None:
    body = chat("How do I reset my password?")
    canonical = {"messages": [{"role": "user"}], "model": "glm-5", "query_numbers": [], "temperature": 0.2}
    text = json.dumps(canonical, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    assert semantic_context_key(body) == hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_semantic_query_is_the_last_user_text() -> None:
    assert semantic_query(chat("What is 2+2?", earlier=[{"role": "system", "content": "s"}])) == "What is 2+2?"


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m"},
        {"model": "m", "messages": []},
        {"model": "m", "messages": "hi"},
        {"model": "m", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        {"model": "m", "messages": [{"role": "system", "content": "s"}]},
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}]},
        {"model": "m", "messages": [{"role": "user", "content": None}]},
        {"model": "m", "messages": ["not a message"]},
    ],
)
def test_semantic_query_none_when_not_cacheable(body: dict[str, Any]) -> None:
    assert semantic_query(body) is None
