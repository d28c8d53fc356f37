"""Embeddings, framework-free: validation, per-text cache, one Triton call for the misses (refused while the GPU
policy sheds bulk work, `gateway.gpu`)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

from gateway import metrics
from gateway.cache.embeddings import CachedEmbedding, EmbeddingCache
from gateway.errors import InputTooLongError, InvalidRequestError, NotFoundError
from gateway.gpu.protection import GpuProtection, GpuReadiness, GpuWork
from gateway.protocol.unicode import has_lone_surrogate, is_blank
from gateway.services.single_flight import CallAbandonedError, CallerLedFlight
from gateway.settings import LimitSettings
from gateway.upstreams.triton import ModelInfo, TritonEmbeddings

CacheOutcome = Literal["hit", "miss"]  # hit: every text came from the cache
InputType = Literal["query", "document"]  # a query gets the model's query instruction in front
ENSEMBLE_ALIAS = "bge"


@dataclass(frozen=True)
class EmbeddingResult:
    vectors: npt.NDArray[np.float32]  # [texts, dimension], L2-normalised, in input order
    model: str  # the served checkpoint's name, e.g. "BAAI/bge-large-zh-v1.5"
    prompt_tokens: int  # tokens the model saw, special tokens included
    truncated_texts: int  # texts cut at the model's maximum length
    cache: CacheOutcome
    cached_texts: int  # texts answered from the cache (some, on a miss, when the rest went to Triton)
    truncated: tuple[bool, ...] = ()  # per text, in input order


class Embedder(Protocol):
    """What the service needs from Triton (`gateway.upstreams.triton.TritonClient`)."""

    async def model_info(self, *, refresh: bool = False) -> ModelInfo: ...

    async def embed(self, texts: list[str]) -> TritonEmbeddings: ...

    async def ready(self) -> bool: ...


class EmbeddingService:
    """Serves embeddings from the cache where it can and computes the rest in one Triton call.

    Identical texts, inside one request or across concurrent requests, are
    computed once (single flight). With `gpu`, uncached bulk work is refused while no Triton has GPU memory to
    spare.
    """

    def __init__(
        self,
        embedder: Embedder,
        cache: EmbeddingCache | None,
        limits: LimitSettings,
        gpu: GpuProtection | None = None,
    ) -> None:
        self._embedder = embedder
        self._cache = cache
        self._limits = limits
        self._gpu = gpu
        self._in_flight: CallerLedFlight[tuple[str, str, str], dict[str, CachedEmbedding]] = CallerLedFlight()

    async def ready(self) -> bool:
        return await self._embedder.ready()

    async def embed_texts(self, texts: list[str]) -> npt.NDArray[np.float32]:
        """Vectors only: what the semantic prompt cache compares."""
        return (await self.embed(texts, gpu_work=None)).vectors

    async def model_info(self) -> ModelInfo:
        """The served model (the last one seen while Triton is unreachable)."""
        return await self._embedder.model_info()

    def gpu_readiness(self) -> GpuReadiness | None:
        """None when no GPU metrics are configured."""
        return None if self._gpu is None else self._gpu.readiness()

    async def cache_ready(self) -> bool | None:
        """None when no cache is configured."""
        return None if self._cache is None else await self._cache.ping()

    async def embed(
        self,
        texts: Sequence[str],
        *,
        model: str | None = None,
        truncate: bool = True,
        use_cache: bool = True,
        input_type: InputType = "document",
        instruction: str | None = None,
        gpu_work: GpuWork | None = "embeddings",
    ) -> EmbeddingResult:
        """`input_type` "query" puts `instruction` (default: the served model's query instruction) in front of
        each text, as retrieval models such as BGE expect of short queries. `gpu_work` is what the texts are to the
        GPU policy: "embeddings" are bulk when more than one of them is not cached, "upsert" always; None never (a
        search query, the semantic cache's prompt)."""
        self._validate(texts)
        info = await self._embedder.model_info()
        check_model(model, info)
        if input_type == "query":
            prefix = info.query_instruction if instruction is None else instruction
            texts = [prefix + text for text in texts] if prefix else texts
        cached: list[CachedEmbedding | None] = [None] * len(texts)
        if use_cache and self._cache is not None:
            cached = await self._cache.get_many(info.name, info.variant, list(texts))
        misses = sorted({text for text, entry in zip(texts, cached, strict=True) if entry is None})
        if misses and gpu_work is not None and self._gpu is not None:
            self._gpu.refuse_bulk(gpu_work, len(misses))  # bulk or not by what Triton would compute
        computed = await self._compute(info, misses) if misses else {}
        entries = [entry or computed[text] for text, entry in zip(texts, cached, strict=True)]
        if not truncate:
            refuse_truncated(entries, info)
        hits = sum(entry is not None for entry in cached)
        truncated = sum(e.truncated for e in entries)
        if truncated:
            metrics.EMBEDDING_TEXTS_TRUNCATED.inc(truncated)
        return EmbeddingResult(
            vectors=np.stack([e.vector for e in entries]),
            model=info.name,
            prompt_tokens=sum(e.token_count for e in entries),
            truncated_texts=truncated,
            cache="hit" if hits == len(texts) else "miss",
            cached_texts=hits,
            truncated=tuple(e.truncated for e in entries),
        )

    def _validate(self, texts: Sequence[str]) -> None:
        limits = self._limits
        if not texts:
            raise InvalidRequestError("input must contain at least one text", param="input")
        if len(texts) > limits.max_texts_per_request:
            raise InvalidRequestError(
                f"input has {len(texts)} texts; the maximum is {limits.max_texts_per_request}", param="input"
            )
        for index, text in enumerate(texts):
            if is_blank(text):
                raise InvalidRequestError(f"input[{index}] is empty or has no visible character", param="input")
            if has_lone_surrogate(text):
                raise InvalidRequestError(f"input[{index}] is not valid Unicode (a lone surrogate)", param="input")
            if len(text) > limits.max_text_chars:
                raise InvalidRequestError(
                    f"input[{index}] has {len(text)} characters; the maximum is {limits.max_text_chars}", param="input"
                )

    async def _compute(self, info: ModelInfo, texts: list[str]) -> dict[str, CachedEmbedding]:
        """Embed distinct `texts`; wait for the calls of other requests already computing some of them
        instead of repeating them (and compute those here if such a request goes away first)."""
        computed: dict[str, CachedEmbedding] = {}
        pending = texts
        while pending:
            keys = {text: (info.name, info.variant, text) for text in pending}
            running = {text: self._in_flight.running(key) for text, key in keys.items()}
            leading = [text for text, outcome in running.items() if outcome is None]
            if leading:
                computed |= await self._in_flight.lead([keys[t] for t in leading], self._call_triton(info, leading))
            for outcome in {outcome for outcome in running.values() if outcome is not None}:
                with suppress(CallAbandonedError):  # its texts stay pending: computed here on the next turn
                    batch = await self._in_flight.follow(outcome)
                    computed |= {text: batch[text] for text in batch if text in keys}
            pending = [text for text in pending if text not in computed]
        return computed

    async def _call_triton(self, info: ModelInfo, texts: list[str]) -> dict[str, CachedEmbedding]:
        result = await self._embedder.embed(texts)
        entries = [
            CachedEmbedding(vector=vector, token_count=int(count), truncated=bool(cut))
            for vector, count, cut in zip(result.vectors, result.token_counts, result.truncated, strict=True)
        ]
        if self._cache is not None:
            await self._cache.put_many(info.name, info.variant, texts, entries)
        return dict(zip(texts, entries, strict=True))


def check_model(requested: str | None, info: ModelInfo) -> None:
    if requested and requested not in (ENSEMBLE_ALIAS, info.name):
        raise NotFoundError(
            f"model {requested!r} is not served here; use {info.name!r} or {ENSEMBLE_ALIAS!r}", param="model"
        )


def refuse_truncated(entries: list[CachedEmbedding], info: ModelInfo) -> None:
    for index, entry in enumerate(entries):
        if entry.truncated:
            raise InputTooLongError(
                f"input[{index}] is longer than the model's maximum of {info.max_sequence_length} tokens; "
                "shorten it or send truncate: true",
                param="input",
            )
