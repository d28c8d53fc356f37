"""64-bit SimHash over character n-grams: near-duplicate texts get hashes that differ in few bits.

N-grams of characters, not words, so text without spaces, such as Chinese, works.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np

SIMHASH_BITS = 64


def simhash64(text: str, n: int = 3) -> int:
    """64-bit SimHash of the lower-cased, whitespace-collapsed text's character n-grams, weighted by count."""
    if n < 1:
        raise ValueError(f"n-gram size must be >= 1, got {n}")
    normal = " ".join(text.lower().split())
    if not normal:
        return 0
    grams = Counter(normal[i : i + n] for i in range(max(1, len(normal) - n + 1)))
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
