"""The semantic prompt cache: find an earlier request whose last user message says the same thing.

Two requests share a *context* when everything but the last user message's text is
identical (model, sampling parameters, every earlier turn; delivery fields aside), so
a multi-turn conversation only matches when all its earlier turns match; and when that
text has the same numbers in the same order: "what is 12345 * 6789?" and "... 6788?" are
near-identical texts and different questions; and the same polarity, so "how do I enable X?"
never answers "how do I not enable X?" (`query_negated`). Within a
context, the index keeps (fingerprint, exact key) pairs, newest first; a lookup
returns the exact key (`gateway.cache.chat.exact_key`) of the most similar earlier
query at or above the threshold, and the answer is then read from the exact cache.

Similarity is the cosine of the embedding model's unit vectors (`EmbeddingMatcher`)
or 64-bit SimHash over character n-grams (`SimHashMatcher`; n-grams of characters,
not words, so text without spaces, such as Chinese, works). The cache only saves
work: a failing store or embedder is counted and the request goes on without it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import struct
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from gateway import metrics
from gateway.cache.base import CacheStoreError
from gateway.cache.chat import DELIVERY_FIELDS
from gateway.cache.redis_store import RedisBackedStore

log = logging.getLogger(__name__)

T = TypeVar("T")

CACHE_NAME = "chat_semantic"
REDIS_PREFIX = "sem:v1:"
SIMHASH_BITS = 64
RECENT_FINGERPRINTS = 256  # lookup's fingerprint is reused by the add() that follows a miss
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_THOUSANDS = re.compile(r",(?=\d{3}(?!\d))")  # "1,500" is 1500; "1,2" (a list, or a decimal comma) is not 12
# Polarity is the parity of negations: "not X" matches "never X", and "不得不" (must) is not negated. "nor" only
# continues a negation already counted ("neither A nor B"), so it is none; "not only", "no matter" and "No. 2"
# are no negation either.
_EN_NEGATION = re.compile(
    r"\b(?:not(?! only\b)|no(?! matter\b|\.\s*\d)|none|nothing|nobody|nowhere|never|neither|cannot|without"
    r"|dont|doesnt|didnt|isnt|arent|wasnt|werent|cant|couldnt|wouldnt|shouldnt|wont|havent|hasnt|hadnt|aint)\b"
    r"|n['’]t\b"
)
_ZH_NEGATION = re.compile(r"[不没无非未别勿莫]")
# Removed before counting, as they do not negate the question: A-not-A (是不是, 有没有) and a clause-final 不/没
# ("能带上火车不?") ask yes or no; 别 is mostly part of a word (区别, 特别, 别人), rarely "don't"; the words
# listed have plain synonyms a paraphrase may use (不同/区别, 非常/很, 无线/wifi, 尿不湿/纸尿裤). Every branch
# starts with one literal character, so `re` skips ahead to those instead of trying every position of a long text.
_ZH_NOT_NEGATING = re.compile(
    r"不(?<=(.)不)\1|没(?<=(.)没)\2|有没|不(?=\s*(?:[?？。!！~～]|$))|没(?=\s*(?:[?？。!！~～]|$))"
    r"|不好意思|不错|不过|不同|不一样|不少|不久|不仅|不但|不管(?!用)|不论|不断|不然|尿不湿"
    r"|无论|无故|无线|无限|无锡|非常|未来|出没"
    r"|别(?<=[区特分辨级性类识差告鉴个派道送离判职诀]别)|别[人的处墅名称致针]"
)
_LENGTH = struct.Struct("<H")  # entry framing: fingerprint length, fingerprint, answer key (UTF-8)


# --- what is compared ---------------------------------------------------------------------------


def semantic_query(body: dict[str, Any]) -> str | None:
    """The text of the last message when it is a user message with string content; else None (not cacheable)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    content = last.get("content")
    return content if isinstance(content, str) else None


def semantic_context_key(body: dict[str, Any]) -> str:
    """SHA-256 (hex) of the canonical request without the last user message's text (but with its numbers and,
    when negated, its polarity) and the delivery fields."""
    canonical = {k: v for k, v in body.items() if k not in DELIVERY_FIELDS}
    if (query := semantic_query(body)) is not None:
        *earlier, last = body["messages"]
        canonical["messages"] = [*earlier, {k: v for k, v in last.items() if k != "content"}]
        canonical["query_numbers"] = query_numbers(query)
        if query_negated(query):  # only then: a plain question keeps the key it had before polarity was added
            canonical["query_negated"] = True
    text = json.dumps(canonical, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def query_numbers(text: str) -> list[str]:
    """The numbers in `text`, in order, without thousands separators ("1,500" and "1500" are one number)."""
    return [_THOUSANDS.sub("", number) for number in _NUMBER.findall(text)]


def query_negated(text: str) -> bool:
    """Whether `text` is negated: an odd number of negations (not, n't, never, without, 不, 没, 无法, ...) in English
    or Chinese, leaving out words that do not negate the question (非常, 不错, 是不是, "not only", ...)."""
    negations = len(_EN_NEGATION.findall(text.lower())) + len(_ZH_NEGATION.findall(_ZH_NOT_NEGATING.sub(" ", text)))
    return negations % 2 == 1


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


# --- matchers -----------------------------------------------------------------------------------


class TextEmbedder(Protocol):
    async def embed_texts(self, texts: list[str]) -> npt.NDArray[np.float32]:
        """Unit vectors, float32 [len(texts), dimension]."""
        ...


class Matcher(Protocol):
    name: str  # part of the store context: fingerprints of different matchers are never compared

    async def fingerprints(self, texts: list[str]) -> list[bytes]: ...

    def similarity(self, a: bytes, b: bytes) -> float: ...

    def comparable(self, text: str) -> bool:
        """Whether `text` carries enough to be matched at all; others are neither looked up nor indexed."""
        ...


class EmbeddingMatcher:
    """Cosine similarity of the embedding model's vectors; a fingerprint is the float32 little-endian unit vector.

    Name it after the model (e.g. "embedding:<model>@<revision>") so that changing
    the model starts a new index instead of comparing vectors of different spaces.
    """

    def __init__(self, embedder: TextEmbedder, name: str = "embedding") -> None:
        self._embedder = embedder
        self.name = name

    async def fingerprints(self, texts: list[str]) -> list[bytes]:
        vectors = np.asarray(await self._embedder.embed_texts(texts), dtype="<f4")
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.where(norms > 0, norms, 1.0).astype("<f4")  # already unit: guards a foreign embedder
        return [row.tobytes() for row in vectors]

    def similarity(self, a: bytes, b: bytes) -> float:
        if len(a) != len(b) or len(a) % 4:
            return 0.0
        return float(np.dot(np.frombuffer(a, dtype="<f4"), np.frombuffer(b, dtype="<f4")))

    def comparable(self, text: str) -> bool:
        return bool(text.strip())


class SimHashMatcher:
    """Share of equal bits of two 64-bit SimHashes over character n-grams; a fingerprint is 8 bytes.

    A text of a few n-grams is not compared: each bit is then a vote of a few +-1 and often a tie (0 in both
    hashes), so different short texts look alike ("q171" and "q172" score 0.906, above the 0.88 default).
    """

    MIN_GRAMS = 8  # distinct n-grams a text needs to be matched

    def __init__(self, n: int = 3) -> None:
        if n < 1:
            raise ValueError(f"n-gram size must be >= 1, got {n}")
        self.n = n
        self.name = f"simhash{n}"

    async def fingerprints(self, texts: list[str]) -> list[bytes]:
        return [simhash64(text, self.n).to_bytes(8, "little") for text in texts]

    def similarity(self, a: bytes, b: bytes) -> float:
        if len(a) != 8 or len(b) != 8:
            return 0.0
        return simhash_similarity(int.from_bytes(a, "little"), int.from_bytes(b, "little"))

    def comparable(self, text: str) -> bool:
        normal = " ".join(text.lower().split())
        return len({normal[i : i + self.n] for i in range(len(normal) - self.n + 1)}) >= self.MIN_GRAMS


# --- stores -------------------------------------------------------------------------------------


class SemanticEntry(NamedTuple):
    fingerprint: bytes
    answer_key: str


class SemanticStore(Protocol):
    async def entries(self, context: str) -> list[SemanticEntry]:
        """The context's entries, newest first; [] when none. Raises `CacheStoreError`."""
        ...

    async def add(self, context: str, entry: SemanticEntry, *, max_entries: int, ttl_seconds: int) -> None:
        """Put `entry` first, keep the newest `max_entries`, expire the context `ttl_seconds` after this write."""
        ...

    async def aclose(self) -> None: ...


class _Context(NamedTuple):
    entries: list[SemanticEntry]
    expires_at: float


class MemorySemanticStore:
    """In-process: context -> bounded list, newest first; the least recently used contexts go first."""

    def __init__(self, max_contexts: int = 10_000, *, clock: Callable[[], float] = time.monotonic) -> None:
        if max_contexts < 1:
            raise ValueError(f"max_contexts must be >= 1, got {max_contexts}")
        self.max_contexts = max_contexts
        self._clock = clock
        self._contexts: OrderedDict[str, _Context] = OrderedDict()

    def __len__(self) -> int:
        return len(self._contexts)

    async def entries(self, context: str) -> list[SemanticEntry]:
        held = self._contexts.get(context)
        if held is None:
            return []
        if held.expires_at <= self._clock():
            del self._contexts[context]
            return []
        self._contexts.move_to_end(context)
        return list(held.entries)

    async def add(self, context: str, entry: SemanticEntry, *, max_entries: int, ttl_seconds: int) -> None:
        entries = [entry, *await self.entries(context)][:max_entries]
        self._contexts[context] = _Context(entries, self._clock() + ttl_seconds)
        self._contexts.move_to_end(context)
        while len(self._contexts) > self.max_contexts:
            self._contexts.popitem(last=False)

    async def aclose(self) -> None:
        self._contexts.clear()


def encode_entry(entry: SemanticEntry) -> bytes:
    return _LENGTH.pack(len(entry.fingerprint)) + entry.fingerprint + entry.answer_key.encode("utf-8")


def decode_entry(data: bytes) -> SemanticEntry:
    """Inverse of `encode_entry`; raises ValueError on a malformed entry."""
    if len(data) < _LENGTH.size:
        raise ValueError(f"semantic entry of {len(data)} bytes is shorter than its {_LENGTH.size}-byte header")
    (length,) = _LENGTH.unpack_from(data)
    end = _LENGTH.size + length
    if len(data) <= end:
        raise ValueError(f"semantic entry of {len(data)} bytes has no answer key after a {length}-byte fingerprint")
    return SemanticEntry(data[_LENGTH.size : end], data[end:].decode("utf-8"))


class RedisSemanticStore(RedisBackedStore):
    """One Redis list per context (`sem:v1:<context>`), newest entry first, shared by every replica.

    A write is one pipeline (LPUSH, LTRIM, EXPIRE), a read one LRANGE, so an entry
    written by one replica is visible to the next read anywhere. Failures become
    `CacheStoreError` and, like `RedisStore`, make calls fail fast for `backoff_seconds`.
    """

    def __init__(self, url: str, timeout_seconds: float = 0.25, **options: Any) -> None:
        super().__init__(url, timeout_seconds=timeout_seconds, **options)

    async def entries(self, context: str) -> list[SemanticEntry]:
        raw = await self._call("lrange", lambda: self._client.lrange(REDIS_PREFIX + context, 0, -1))
        found = []
        for item in raw:
            try:
                found.append(decode_entry(item if isinstance(item, bytes) else item.encode()))
            except ValueError:  # UnicodeDecodeError included
                log.warning("skipping a malformed semantic cache entry in context %s", context)
        return found

    async def add(self, context: str, entry: SemanticEntry, *, max_entries: int, ttl_seconds: int) -> None:
        await self._call(
            "push", lambda: self._push(REDIS_PREFIX + context, encode_entry(entry), max_entries, ttl_seconds)
        )

    async def _push(self, key: str, value: bytes, max_entries: int, ttl_seconds: int) -> None:
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.lpush(key, value)
            pipe.ltrim(key, 0, max_entries - 1)
            pipe.expire(key, ttl_seconds)
            await pipe.execute()


# --- the index ----------------------------------------------------------------------------------


class SemanticHit(NamedTuple):
    answer_key: str  # the exact-cache key of the earlier request
    similarity: float


class SemanticIndex:
    """Finds the exact key of the most similar earlier query in the same context; never raises for a failing part."""

    def __init__(
        self,
        store: SemanticStore,
        matcher: Matcher,
        threshold: float,
        *,
        max_entries_per_context: int = 500,
        ttl_seconds: int = 86400,
    ) -> None:
        if not -1.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [-1, 1], got {threshold}")
        if max_entries_per_context < 1:
            raise ValueError(f"max_entries_per_context must be >= 1, got {max_entries_per_context}")
        if ttl_seconds < 1:
            raise ValueError(f"ttl_seconds must be >= 1, got {ttl_seconds}")
        self.store = store
        self.matcher = matcher
        self.threshold = threshold
        self.max_entries_per_context = max_entries_per_context
        self.ttl_seconds = ttl_seconds
        self._recent: OrderedDict[str, bytes] = OrderedDict()

    async def lookup(self, body: dict[str, Any]) -> SemanticHit | None:
        """The best earlier match at or above the threshold (the newest among equals), or None."""
        query = semantic_query(body)
        if query is None or not self.matcher.comparable(query):
            return None
        entries = await self._entries(self.context(body), "get")
        if entries is None:
            return None
        best = await self._best(query, entries) if entries else None  # an empty context needs no embedding
        metrics.CACHE_LOOKUPS.labels(cache=CACHE_NAME, result="hit" if best else "miss").inc()
        return best

    async def add(self, body: dict[str, Any], answer_key: str) -> None:
        """Index `body`'s last user message as answered under `answer_key` (once per context and text)."""
        query = semantic_query(body)
        if query is None or not self.matcher.comparable(query):
            return
        context = self.context(body)
        entries = await self._entries(context, "set")
        # Same context and same text means the same exact key, so the key identifies the text.
        if entries is None or any(entry.answer_key == answer_key for entry in entries):
            return
        fingerprint = await self._fingerprint(query)
        if fingerprint is None:
            return
        entry = SemanticEntry(fingerprint, answer_key)
        try:
            await self.store.add(context, entry, max_entries=self.max_entries_per_context, ttl_seconds=self.ttl_seconds)
        except CacheStoreError as exc:
            self._failed("set", exc)

    async def aclose(self) -> None:
        await self.store.aclose()

    def context(self, body: dict[str, Any]) -> str:
        """The store context of `body`: the matcher and everything but the last user text."""
        return f"{self.matcher.name}:{semantic_context_key(body)}"

    async def _entries(self, context: str, operation: str) -> list[SemanticEntry] | None:
        try:
            return await self.store.entries(context)
        except CacheStoreError as exc:
            self._failed(operation, exc)
            return None

    async def _best(self, query: str, entries: list[SemanticEntry]) -> SemanticHit | None:
        fingerprint = await self._fingerprint(query)
        if fingerprint is None:
            return None
        best: SemanticHit | None = None
        for entry in entries:
            similarity = self.matcher.similarity(fingerprint, entry.fingerprint)
            if similarity >= self.threshold and (best is None or similarity > best.similarity):
                best = SemanticHit(entry.answer_key, similarity)
        return best

    async def _fingerprint(self, query: str) -> bytes | None:
        known = self._recent.get(query)
        if known is not None:
            self._recent.move_to_end(query)
            return known
        try:
            (fingerprint,) = await self.matcher.fingerprints([query])
        except Exception as exc:  # the embedder's own errors: the request must go on without the cache
            self._failed("fingerprint", exc)
            return None
        self._recent[query] = fingerprint
        if len(self._recent) > RECENT_FINGERPRINTS:
            self._recent.popitem(last=False)
        return fingerprint

    @staticmethod
    def _failed(operation: str, exc: Exception) -> None:
        metrics.CACHE_ERRORS.labels(cache=CACHE_NAME, operation=operation).inc()
        log.warning("semantic cache %s failed: %s", operation, exc)
