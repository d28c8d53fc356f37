"""The per-text embedding cache: one vector per (model, revision, text), shared across requests.

Keys hash the model, its revision and the text with SHA-256 (never Python's
`hash()`, which is salted per process), so every replica agrees on them and a
new revision never reads an old model's vectors. The gateway passes the served
model's `ModelInfo.variant` as the revision: the checkpoint's and the token
limit, which decides where a long text is cut. The precision (INT8 on CPUs,
FP16 on GPUs) is not in it: both pass the export's parity gate against the
same PyTorch vectors, so either may answer for the other on a shared Redis. Values are a 9-byte
little-endian header plus the raw float32 vector: 4 KiB for a 1024-d vector,
against about 20 KiB as JSON, and decoded without parsing.

The cache only saves work: a failing store is counted and logged, and the
request goes on as if every text missed.
"""

from __future__ import annotations

import hashlib
import logging
import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gateway import metrics
from gateway.cache.base import ByteStore, CacheStoreError

logger = logging.getLogger(__name__)

KEY_PREFIX = "emb:v1:"  # bump the version when the value format changes
_HEADER = struct.Struct("<IBI")  # token_count uint32, flags uint8, dimension uint32
_FLAG_TRUNCATED = 0x01
_UINT32_MAX = 2**32 - 1
_LE_FLOAT32 = np.dtype("<f4")


@dataclass(frozen=True)
class CachedEmbedding:
    vector: npt.NDArray[np.float32]  # [dimension]
    token_count: int
    truncated: bool


def embedding_key(model: str, revision: str, text: str) -> str:
    """The store key of `text` embedded by `model` at `revision`; stable across processes and hosts."""
    digest = hashlib.sha256(f"{model}\0{revision}\0{text}".encode()).hexdigest()
    return KEY_PREFIX + digest


def encode_entry(entry: CachedEmbedding) -> bytes:
    """Header + little-endian float32 vector; raises ValueError for what the format cannot hold."""
    if entry.vector.ndim != 1:
        raise ValueError(f"vector must have 1 dimension, got shape {entry.vector.shape}")
    if not 0 <= entry.token_count <= _UINT32_MAX:
        raise ValueError(f"token_count must be in [0, {_UINT32_MAX}], got {entry.token_count}")
    flags = _FLAG_TRUNCATED if entry.truncated else 0
    header = _HEADER.pack(entry.token_count, flags, entry.vector.shape[0])
    return header + np.ascontiguousarray(entry.vector, dtype=_LE_FLOAT32).tobytes()


def decode_entry(data: bytes) -> CachedEmbedding:
    """The entry `encode_entry` wrote; raises ValueError when `data` is not such a value."""
    if len(data) < _HEADER.size:
        raise ValueError(f"cached embedding needs a {_HEADER.size}-byte header, got {len(data)} bytes")
    token_count, flags, dimension = _HEADER.unpack_from(data)
    if flags & ~_FLAG_TRUNCATED:
        raise ValueError(f"cached embedding has unknown flags {flags:#04x}")
    expected = _HEADER.size + dimension * _LE_FLOAT32.itemsize
    if len(data) != expected:
        raise ValueError(f"cached embedding of dimension {dimension} needs {expected} bytes, got {len(data)}")
    vector = np.frombuffer(data, dtype=_LE_FLOAT32, offset=_HEADER.size).astype(np.float32)
    return CachedEmbedding(vector=vector, token_count=token_count, truncated=bool(flags & _FLAG_TRUNCATED))


class EmbeddingCache:
    """Looks texts up and stores their vectors in one store call per batch, never failing the request."""

    def __init__(self, store: ByteStore, *, ttl_seconds: int | None, name: str = "embedding") -> None:
        self._store = store
        self._ttl_seconds = ttl_seconds
        self._name = name
        self._failing = False  # warn once per outage, not once per request

    async def get_many(self, model: str, revision: str, texts: list[str]) -> list[CachedEmbedding | None]:
        """One entry per text, in order; None for a miss, and for every text when the store fails."""
        if not texts:
            return []
        keys = [embedding_key(model, revision, text) for text in texts]
        try:
            values = await self._store.get_many(keys)
        except CacheStoreError as exc:
            self._store_failed("get", exc)
            return [None] * len(texts)
        self._store_answered()
        entries = [self._decode(value) for value in values]
        self._count_lookups(entries)
        return entries

    async def put_many(self, model: str, revision: str, texts: list[str], entries: list[CachedEmbedding]) -> None:
        """Store each text's entry; a failing store is counted and otherwise ignored."""
        if len(texts) != len(entries):
            raise ValueError(f"{len(texts)} texts but {len(entries)} entries")
        if not texts:
            return
        pairs = zip(texts, entries, strict=True)
        items = {embedding_key(model, revision, text): encode_entry(entry) for text, entry in pairs}
        try:
            await self._store.set_many(items, self._ttl_seconds)
        except CacheStoreError as exc:
            self._store_failed("set", exc)
            return
        self._store_answered()

    async def ping(self) -> bool:
        try:
            return await self._store.ping()
        except CacheStoreError:
            return False

    async def aclose(self) -> None:
        await self._store.aclose()

    def _decode(self, value: bytes | None) -> CachedEmbedding | None:
        """A corrupt value (another writer, an old format) is a miss: the vector is computed again."""
        if value is None:
            return None
        try:
            return decode_entry(value)
        except ValueError as exc:
            metrics.CACHE_ERRORS.labels(cache=self._name, operation="get").inc()
            logger.warning("%s cache: ignoring a malformed cached value: %s", self._name, exc)
            return None

    def _count_lookups(self, entries: list[CachedEmbedding | None]) -> None:
        hits = sum(entry is not None for entry in entries)
        metrics.CACHE_LOOKUPS.labels(cache=self._name, result="hit").inc(hits)
        metrics.CACHE_LOOKUPS.labels(cache=self._name, result="miss").inc(len(entries) - hits)

    def _store_failed(self, operation: str, exc: CacheStoreError) -> None:
        metrics.CACHE_ERRORS.labels(cache=self._name, operation=operation).inc()
        if not self._failing:  # DEBUG: the store's Redis circuit logs the outage, once for every user
            logger.debug("%s cache: store %s failed, serving without the cache: %s", self._name, operation, exc)
        self._failing = True

    def _store_answered(self) -> None:
        if self._failing:
            logger.debug("%s cache: store answers again", self._name)
        self._failing = False
