"""Character n-grams of a text: their 64-bit SimHash (near-duplicate texts get hashes that differ in few bits) and
the exact cosine of two texts' n-gram counts, which the SimHash estimates.

N-grams of characters, not words, so text without spaces, such as Chinese, works.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter

import numpy as np

SIMHASH_BITS = 64


def normalised(text: str) -> str:
    """Lower-cased, whitespace collapsed: what the n-grams are taken from."""
    return " ".join(text.lower().split())


def ngram_counts(normal: str, n: int) -> Counter[str]:
    """The character n-grams of an already normalised text, with their counts."""
    return Counter(normal[i : i + n] for i in range(max(1, len(normal) - n + 1)))


def ngram_cosine(a: Counter[str], b: Counter[str]) -> float:
    """Cosine of two n-gram count vectors, the quantity a SimHash estimates; 0.0 when either is empty."""
    if len(a) > len(b):
        a, b = b, a
    dot = sum(count * b[gram] for gram, count in a.items() if gram in b)
    norms = math.sqrt(sum(c * c for c in a.values()) * sum(c * c for c in b.values()))
    return dot / norms if norms else 0.0


def simhash64(text: str, n: int = 3) -> int:
    """64-bit SimHash of the lower-cased, whitespace-collapsed text's character n-grams, weighted by count."""
    if n < 1:
        raise ValueError(f"n-gram size must be >= 1, got {n}")
    normal = normalised(text)
    if not normal:
        return 0
    grams = ngram_counts(normal, n)
    hashes = np.array(
        [int.from_bytes(hashlib.blake2b(g.encode("utf-8"), digest_size=8).digest(), "little") for g in grams],
        dtype="<u8",
    )
    bits = np.unpackbits(hashes.view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")  # [grams, 64], bit i of int
    weights = np.fromiter(grams.values(), dtype=np.int64, count=len(grams))
    votes = weights @ (2 * bits.astype(np.int64) - 1)
    return int.from_bytes(np.packbits(votes > 0, bitorder="little").tobytes(), "little")


def simhash_similarity(a: int, b: int) -> float:
    """1 - Hamming distance / 64: 1.0 for equal hashes, about 0.5 for unrelated texts."""
    return 1.0 - (a ^ b).bit_count() / SIMHASH_BITS
