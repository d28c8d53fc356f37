"""The lexical analyzer: what BM25 counts as a term, in English, Chinese and both at once."""

from __future__ import annotations

import pytest

from gateway.search.analyzer import analyze


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # stemmed, case folded, stop words out
        ("The cells were Running studies on proteins.", "cell were run studi protein"),
        # full-width forms folded (NFKC); codes and model numbers stay whole
        ("ＧＰＵ A100 and SKU-4711", "gpu a100 sku 4711"),
        # Chinese: jieba's words, then each character of a run of several
        ("北京天安门", "北京 天安门 北 京 天 安 门"),
        ("猫", "猫"),
        # Chinese stop words out, as words and as characters; a character of a kept word stays a term
        ("北京的天气怎么样", "北京 天气 怎么样 北 京 天 气 样"),
        ("这个手机是什么牌子的吗", "这个 手机 是 牌子 这 手 机 是 牌 子"),
        ("的", ""),
        # mixed text: each script by its own rule, in order
        ("Triton 推理服务器 runs models", "triton 推理 服务器 推 理 服 务 器 run model"),
        # other scripts kept as words; accents kept
        ("Привет мир, naïve café", "привет мир naïve café"),
        # nothing to count
        ("", ""),
        ("... !!! the of", ""),
    ],
)
def test_terms(text: str, expected: str) -> None:
    assert analyze(text) == expected


def test_documents_and_queries_meet_on_the_same_terms() -> None:
    """A query's inflection or case finds the document's (the point of analyzing both the same way)."""
    document = analyze("Migrating collections between clusters").split()
    assert analyze("migrate a collection").split() == ["migrat", "collect"]
    assert {"migrat", "collect"} <= set(document)


def test_an_over_long_token_is_left_out() -> None:
    assert analyze("a" * 41 + " kept") == "kept"
