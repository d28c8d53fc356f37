"""The text analyzer of lexical search: what BM25 counts as a term, the same for documents and queries and for
every store (the stores index the terms it writes, split on spaces, so their scores agree).

Text is normalised (NFKC, case folded), then split into runs of Han characters and words of other scripts:
- Han runs are segmented into words by jieba's dictionary (rjieba, its Rust port) and each character is kept as
  a term too: words make a match precise, characters let a query find a word segmented otherwise in a document
  (docs/benchmarks.md has what each buys on the Chinese duplicate-question set); Chinese stop words go, words and
  characters alike;
- other words (letters and digits, so codes such as "a100" or "sku123" stay whole) lose English stop words and
  are stemmed by the Snowball English stemmer when they are Latin letters; other scripts are kept as they are.

A change to any of this changes `ANALYZER`: collections indexed by another version answer lexical searches only
after a re-index has written their terms again.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Sequence
from functools import lru_cache

import rjieba
import Stemmer

ANALYZER = "bm25-zh-en-v2"  # stored in each collection's record with the terms it holds
HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef"
TOKENS = re.compile(rf"([{HAN}]+)|([^\W_{HAN}]+)")
LATIN = re.compile(r"^[a-z]+$")
MAX_TERM_CHARS = 40  # longer "words" (hashes, base64) match only themselves: not worth an index entry
# Lucene's English stop words (Elasticsearch's `_english_`): function words that carry no topic.
LUCENE_STOP_WORDS = (
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with"
)
STOP_WORDS = frozenset(LUCENE_STOP_WORDS.split())
# Chinese function words: the particles, the general classifier and the question words, with the characters that
# spell the question words. They stand in a third of all documents of a question set and weigh almost nothing in
# BM25, yet a query's postings were mostly theirs: BM25 scores every document holding a query's term. Content
# characters that longer lists add (人, 大, 好, 上) stay: dropping them cost quality (docs/benchmarks.md, "Chinese
# stop words").
CHINESE_FUNCTION_WORDS = "的 了 吗 呢 吧 啊 呀 嘛 个 什么 怎么 怎样 为什么 哪 哪个 哪里 什 怎 么"
CHINESE_STOP_WORDS = frozenset(CHINESE_FUNCTION_WORDS.split())


def analyze(text: str) -> str:
    """The text's terms, in order, joined by single spaces (what the stores index and query)."""
    return " ".join(terms(text))


def analyze_many(texts: Sequence[str]) -> list[str]:
    return [analyze(text) for text in texts]


def terms(text: str) -> Iterator[str]:
    for han, word in TOKENS.findall(unicodedata.normalize("NFKC", text).casefold()):
        if han:
            yield from _han_terms(han)
        elif word not in STOP_WORDS and len(word) <= MAX_TERM_CHARS:
            yield _stem(word) if LATIN.match(word) else word


def _han_terms(run: str) -> Iterator[str]:
    words = rjieba.cut(run)
    yield from (word for word in words if word not in CHINESE_STOP_WORDS)
    if len(run) > 1:  # each character too, unless the run is a single one (already a word)
        yield from (char for char in run if char not in CHINESE_STOP_WORDS)


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    stem: str = _STEMMER.stemWord(word)
    return stem


_STEMMER = Stemmer.Stemmer("english")
