"""Reranking, framework-free: a cross-encoder served by Triton scores each (query, document) pair, and the
documents come back best first, in the shape TEI, Cohere and Jina users send and read (`index` into the request's
documents, `relevance_score` in [0, 1]: the sigmoid of the model's logit, as bge-reranker's own `normalize=True`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.errors import InvalidRequestError, NotFoundError
from gateway.gpu.protection import GpuProtection
from gateway.services.texts import check_count, check_text
from gateway.settings import LimitSettings
from gateway.upstreams.triton_reranker import RerankerInfo, RerankerNotServedError, TritonScores
from gateway.usage.record import Usage

MAX_DOCUMENTS = 1000
RERANKER_ALIAS = "reranker"  # the ensemble's own name, accepted as the model like `bge` for embeddings


class Reranker(Protocol):
    async def reranker_info(self) -> RerankerInfo: ...

    async def rerank(self, query: str, documents: list[str]) -> TritonScores: ...


@dataclass(frozen=True)
class Ranked:
    index: int  # into the documents as sent
    relevance_score: float


@dataclass(frozen=True)
class RerankResult:
    results: list[Ranked]  # best first
    tokens: int  # the pairs' tokens, query included in each
    documents: int  # scored (all those sent)
    model: str

    @property
    def usage(self) -> Usage:
        return Usage(rerank_documents=self.documents, rerank_tokens=self.tokens)


class RerankService:
    """`reranker` None: the gateway runs without Triton's client (tests with a stand-in embedder). With `gpu`, reranks
    are refused while no Triton has GPU memory to spare: each is bulk work (one cross-encoder run per document)."""

    def __init__(
        self,
        reranker: Reranker | None,
        limits: LimitSettings,
        model: str = RERANKER_ALIAS,
        gpu: GpuProtection | None = None,
    ) -> None:
        self._reranker = reranker
        self._limits = limits
        self._model = model
        self._gpu = gpu

    async def rerank(
        self, query: str, documents: Sequence[str], *, top_n: int | None = None, model: str | None = None
    ) -> RerankResult:
        """Every document scored against `query`, the best `top_n` (all when None; more than there are: all)."""
        if top_n is not None and top_n < 1:
            raise InvalidRequestError(f"top_n is at least 1, got {top_n}", param="top_n")
        self._check_text(query, "query")
        check_count(len(documents), "documents", MAX_DOCUMENTS)
        for index, document in enumerate(documents):
            self._check_text(document, f"documents[{index}]")
        reranker = self._served()
        info = await reranker.reranker_info()
        if model and model not in (RERANKER_ALIAS, info.name):
            raise NotFoundError(
                f"model {model!r} is not served here; use {info.name!r} or {RERANKER_ALIAS!r}", param="model"
            )
        self.admit(len(documents))
        scored = await reranker.rerank(query, list(documents))
        ranked = sorted(range(len(documents)), key=lambda i: -float(scored.scores[i]))[:top_n]
        return RerankResult(
            [Ranked(i, sigmoid(float(scored.scores[i]))) for i in ranked],
            int(scored.token_counts.sum()),
            len(documents),
            info.name,
        )

    def admit(self, documents: int) -> None:
        """Refuse a rerank of `documents` before any work for it (a search's retrieval included): no reranker is
        served, or every Triton's GPU is short of memory."""
        self._served()
        if self._gpu is not None:
            self._gpu.refuse_bulk("rerank", documents)

    def _served(self) -> Reranker:
        if self._reranker is None:
            raise RerankerNotServedError(self._model)
        return self._reranker

    def _check_text(self, text: str, where: str) -> None:
        check_text(text, where, self._limits.max_text_chars)


def sigmoid(logit: float) -> float:
    return 1.0 / (1.0 + math.exp(-logit)) if logit >= 0 else math.exp(logit) / (1.0 + math.exp(logit))
