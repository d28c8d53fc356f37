"""SimHash over character n-grams: stable, blind to case and spacing, close for small edits, any script."""

from __future__ import annotations

import pytest

from gateway.cache.semantic.simhash import simhash64, simhash_similarity
from tests.helpers.semantic import similar


def test_simhash_is_stable_and_identical_texts_score_one() -> None:
    text = "How do I reset my password?"
    assert simhash64(text) == simhash64(text)
    assert 0 <= simhash64(text) < 1 << 64
    assert similar(text, text) == 1.0


def test_simhash_ignores_case_and_whitespace() -> None:
    assert similar("How do I  reset\nmy password?", "how do i reset my PASSWORD?") == 1.0


def test_simhash_small_edits_stay_close_and_unrelated_texts_far() -> None:
    base = "How do I reset the password of my email account?"
    assert similar(base, "How can I reset the password of my email account?") >= 0.8
    assert similar(base, "The weather in Paris is sunny with a light breeze today.") <= 0.7


def test_simhash_works_on_chinese_without_spaces() -> None:
    base = "请问如何重置我的电子邮箱账户的登录密码，我忘记了原来的密码"
    assert similar(base, "请问如何重置我的电子邮箱帐户的登录密码，我忘记了原来的密码") >= 0.8
    assert similar(base, "今天北京的天气怎么样，会下雨吗，需要带伞吗") <= 0.7


def test_simhash_of_short_and_empty_texts() -> None:
    assert simhash64("") == simhash64("   ") == 0
    assert simhash64("ab") != 0  # shorter than n: the whole text is one gram
    with pytest.raises(ValueError, match="n-gram size"):
        simhash64("text", n=0)


def test_simhash_similarity_counts_equal_bits() -> None:
    assert simhash_similarity(0, 0) == 1.0
    assert simhash_similarity(0, (1 << 64) - 1) == 0.0
    assert simhash_similarity(0b1011, 0b0001) == 1 - 2 / 64
