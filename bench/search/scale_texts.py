"""The texts of the scale step's top-up: each a real document's text varied by a seeded RNG, so that BM25 ties
stay rare.

The 100,000-document top-up gives every filler its source's text unchanged: each real text then stands about 14
times in the collection, and at 1,000,000 about 140 times, every copy scoring the same for every query, so the
exact top 10 of a lexical search would be a draw among equals. Here each filler text is its source's words with
some dropped, some replaced by words of other documents of its language, some written twice, a few more words of
other documents inserted and a few neighbours swapped: the terms, their counts and the length all vary, and few
texts score alike.

The j-th text depends on j and the seed alone (an RNG of its own per text), so a smaller collection's top-up is
the first part of a larger one's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import rjieba

# Chosen on the bench's corpus with 137 variants per source (as at 1,000,000 documents): queries whose exact BM25
# top 10 ends in a tie fell from 34 % (English) and 45 % (Chinese) with 15 % dropped and replaced and 1-3 words
# inserted to 1 % and 4 %, the texts' terms within a tenth of the real ones' count (14.7 a document).
DROP = 0.4  # chance that a word is left out
REPLACE = 0.3  # chance that a kept word is replaced by one of another document
REPEAT = 0.3  # chance that a kept word is written twice (its term counted twice)
INSERTED = 0.6  # words of other documents inserted: 0 to this share of the source's words
SWAPS = 2  # neighbouring words swapped
SEED = 11


class VariedTexts:
    """Filler text j: real document j mod len(documents), varied (module docstring)."""

    def __init__(self, documents: Sequence[str], languages: Sequence[str], seed: int = SEED) -> None:
        self._words = [words(text, language) for text, language in zip(documents, languages, strict=True)]
        self._languages = list(languages)
        self._pools: dict[str, list[str]] = {}
        for language, split in zip(self._languages, self._words, strict=True):
            self._pools.setdefault(language, []).extend(split)
        self._seed = seed

    def __call__(self, index: int) -> str:
        source = index % len(self._words)
        language = self._languages[source]
        rng = random.Random((self._seed << 40) | index)
        pool = self._pools[language]
        varied = []
        for word in self._words[source]:
            if rng.random() >= DROP:
                varied += [rng.choice(pool) if rng.random() < REPLACE else word] * (2 if rng.random() < REPEAT else 1)
        for _ in range(rng.randint(0, math.ceil(INSERTED * len(self._words[source])))):
            varied.insert(rng.randint(0, len(varied)), rng.choice(pool))
        if not varied:  # every word dropped, none inserted: a document keeps one word
            varied = [rng.choice(self._words[source] or pool)]
        for _ in range(SWAPS):
            at = rng.randrange(len(varied) - 1) if len(varied) > 1 else 0
            varied[at : at + 2] = varied[at : at + 2][::-1]
        return joined(varied, language)


def words(text: str, language: str) -> list[str]:
    """English by spaces; Chinese, written without them, by jieba's words (the analyzer's segmenter)."""
    return [word for word in rjieba.cut(text) if word.strip()] if language == "zh" else text.split()


def joined(varied: Sequence[str], language: str) -> str:
    return "".join(varied) if language == "zh" else " ".join(varied)
