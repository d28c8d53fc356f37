"""Embedding cache keys and the binary value format."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gateway.cache.embeddings import CachedEmbedding, decode_entry, embedding_key, encode_entry

MODEL = "BAAI/bge-large-zh-v1.5"
REVISION = "abc123"
TEXT = "你好，世界"
ROOT = Path(__file__).resolve().parents[4]


def entry(dimension: int = 8, *, token_count: int = 7, truncated: bool = False, seed: int = 0) -> CachedEmbedding:
    vector = np.random.default_rng(seed).standard_normal(dimension).astype(np.float32)
    return CachedEmbedding(vector=vector, token_count=token_count, truncated=truncated)


def test_key_is_pinned() -> None:
    """Changing the key changes every replica's cache at once: it must be deliberate (bump `emb:v1`)."""
    expected = "emb:v1:5d4d86a4a9a92f5f06868464c203ffe791aec3fbdec85715fd57ff8ecfb652ad"
    assert embedding_key(MODEL, REVISION, TEXT) == expected


def test_key_is_the_same_in_another_process() -> None:
    """Python's `hash()` of a str differs per process; the key must not."""
    code = (
        f"from gateway.cache.embeddings import embedding_key; print(embedding_key({MODEL!r}, {REVISION!r}, {TEXT!r}))"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert other.stdout.strip() == embedding_key(MODEL, REVISION, TEXT)


@pytest.mark.parametrize(
    "other",
    [
        ("BAAI/bge-small-zh-v1.5", REVISION, TEXT),
        (MODEL, "def456", TEXT),
        (MODEL, REVISION, TEXT + " "),
        (MODEL, REVISION, ""),
        (MODEL + "\0" + REVISION, "", TEXT),  # the separator keeps the fields apart
    ],
)
def test_key_changes_with_model_revision_and_text(other: tuple[str, str, str]) -> None:
    assert embedding_key(*other) != embedding_key(MODEL, REVISION, TEXT)


def test_key_shape() -> None:
    key = embedding_key(MODEL, REVISION, "x" * 100_000)
    assert key.startswith("emb:v1:")
    assert len(key) == len("emb:v1:") + 64


@pytest.mark.parametrize("truncated", [False, True])
def test_round_trip_is_bit_exact(truncated: bool) -> None:
    original = entry(1024, token_count=512, truncated=truncated)
    decoded = decode_entry(encode_entry(original))
    assert decoded.vector.dtype == np.float32
    assert decoded.vector.tobytes() == original.vector.tobytes()
    assert decoded.token_count == 512
    assert decoded.truncated is truncated


def test_round_trip_keeps_special_floats() -> None:
    finfo = np.finfo(np.float32)
    values = [0.0, -0.0, np.inf, -np.inf, np.nan, finfo.max, finfo.tiny, finfo.smallest_subnormal, 1 / 3]
    original = CachedEmbedding(vector=np.array(values, dtype=np.float32), token_count=0, truncated=False)
    assert decode_entry(encode_entry(original)).vector.tobytes() == original.vector.tobytes()


def test_layout_is_little_endian_header_then_float32() -> None:
    original = entry(3, token_count=300, truncated=True)
    data = encode_entry(original)
    assert len(data) == 9 + 3 * 4
    assert struct.unpack("<IBI", data[:9]) == (300, 1, 3)
    assert np.frombuffer(data[9:], dtype="<f4").tolist() == original.vector.tolist()


def test_big_endian_and_strided_vectors_are_written_little_endian() -> None:
    base = entry(16).vector
    for vector in (base.astype(">f4"), base[::2]):
        stored = CachedEmbedding(vector=vector, token_count=1, truncated=False)
        assert decode_entry(encode_entry(stored)).vector.tolist() == vector.tolist()


def test_decoded_vector_is_writable() -> None:
    """Callers normalise or stack vectors in place; a read-only view over the bytes would fail there."""
    decoded = decode_entry(encode_entry(entry(4)))
    decoded.vector[0] = 1.0


def test_empty_vector_round_trips() -> None:
    empty = CachedEmbedding(vector=np.zeros(0, dtype=np.float32), token_count=0, truncated=False)
    assert decode_entry(encode_entry(empty)).vector.shape == (0,)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "needs a 9-byte header, got 0 bytes"),
        (b"\x01\x00\x00", "needs a 9-byte header, got 3 bytes"),
        (struct.pack("<IBI", 1, 0, 4) + b"\x00" * 15, "dimension 4 needs 25 bytes, got 24"),
        (struct.pack("<IBI", 1, 0, 4) + b"\x00" * 17, "dimension 4 needs 25 bytes, got 26"),
        (struct.pack("<IBI", 1, 0x82, 0), "unknown flags 0x82"),
        (b'{"embedding": [0.1, 0.2]}', "cached embedding"),
    ],
)
def test_malformed_values_raise_value_error(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_entry(data)


def test_encode_rejects_what_the_format_cannot_hold() -> None:
    with pytest.raises(ValueError, match=r"1 dimension, got shape \(2, 4\)"):
        encode_entry(CachedEmbedding(vector=np.zeros((2, 4), dtype=np.float32), token_count=1, truncated=False))
    with pytest.raises(ValueError, match="token_count must be in"):
        encode_entry(CachedEmbedding(vector=np.zeros(4, dtype=np.float32), token_count=-1, truncated=False))
