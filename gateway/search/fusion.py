"""Hybrid search's fusion of the dense and the lexical lists into one, as the engines do it:

- `weighted` (Weaviate's `relativeScoreFusion`, its default, and Milvus's `WeightedRanker` on normalised
  scores): each list's scores are scaled to [0, 1] by its own minimum and maximum, then summed with the weights;
  a document missing from a list gets 0 from it. The default: it keeps how far apart the scores are, which ranks
  alone lose, and scored above rrf at every setting tried on the tuning sets (docs/benchmarks.md).
- `rrf`, reciprocal rank fusion (Elasticsearch, Qdrant, Milvus): a document scores sum(weight / (k + rank)) over
  the lists that hold it, rank counted from 1. Ranks only: the two scores' scales never meet.

Each fused hit keeps the scores it had in each list (`Hit.scores`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, get_args

from gateway.errors import InvalidRequestError
from gateway.search.documents import Hit

FusionMethod = Literal["rrf", "weighted"]
SOURCES = ("dense", "lexical")  # the lists hybrid search fuses
RRF_K = 60  # the constant of the RRF paper (Cormack et al., 2009) and of every engine above
MAX_RRF_K = 10_000
MAX_WEIGHT = 100.0
CANDIDATES = 20  # of each list, fused; docs/benchmarks.md has what more or fewer buy
MAX_CANDIDATES = 1000


@dataclass(frozen=True)
class Fusion:
    """How hybrid search fuses; checked when made (400 naming the field)."""

    method: FusionMethod = "weighted"
    k: int = RRF_K  # rrf only
    weights: Mapping[str, float] | None = None  # by list name; a list left out weighs 1
    candidates: int = CANDIDATES  # taken from each list (at least the search's top_k)

    def __post_init__(self) -> None:
        if self.method not in get_args(FusionMethod):
            raise InvalidRequestError(
                f"fusion.method is one of {', '.join(get_args(FusionMethod))}; got {self.method!r}",
                param="fusion.method",
            )
        if not 1 <= self.k <= MAX_RRF_K:
            raise InvalidRequestError(f"fusion.k is 1 to {MAX_RRF_K:,}, got {self.k}", param="fusion.k")
        if not 1 <= self.candidates <= MAX_CANDIDATES:
            raise InvalidRequestError(
                f"fusion.candidates is 1 to {MAX_CANDIDATES:,}, got {self.candidates}", param="fusion.candidates"
            )
        if self.weights is not None:
            _check_weights(self.weights)

    def weight(self, source: str) -> float:
        return 1.0 if self.weights is None else self.weights.get(source, 1.0)


def _check_weights(weights: Mapping[str, float]) -> None:
    for source, weight in weights.items():
        if source not in SOURCES:
            raise InvalidRequestError(
                f"fusion.weights are by list: {' and '.join(SOURCES)}; got {source!r}", param="fusion.weights"
            )
        if not (math.isfinite(weight) and 0.0 <= weight <= MAX_WEIGHT):
            raise InvalidRequestError(
                f"fusion.weights.{source} is 0 to {MAX_WEIGHT:g}, got {weight}", param="fusion.weights"
            )
    if not any(weights.get(source, 1.0) for source in SOURCES):
        raise InvalidRequestError("fusion.weights: at least one weight above 0", param="fusion.weights")


def fuse(lists: Mapping[str, Sequence[Hit]], fusion: Fusion, top_k: int) -> list[Hit]:
    """The `top_k` best documents of the named lists (each best first), fused; ties keep the first list's
    order. Each hit's `score` is the fused score and its `scores` hold its score in each list that has it."""
    fused: dict[str, float] = {}
    found: dict[str, Hit] = {}
    scores: dict[str, dict[str, float]] = {}
    for source, hits in lists.items():
        weight = fusion.weight(source)
        contributions = _rrf(hits, fusion.k) if fusion.method == "rrf" else _normalised(hits)
        for hit, contribution in zip(hits, contributions, strict=True):
            found.setdefault(hit.id, hit)
            fused[hit.id] = fused.get(hit.id, 0.0) + weight * contribution
            scores.setdefault(hit.id, {})[source] = hit.score
    best = sorted(fused, key=lambda document_id: -fused[document_id])[:top_k]
    return [replace(found[i], score=fused[i], scores=scores[i]) for i in best]


def _rrf(hits: Sequence[Hit], k: int) -> list[float]:
    return [1.0 / (k + rank) for rank in range(1, len(hits) + 1)]


def _normalised(hits: Sequence[Hit]) -> list[float]:
    if not hits:
        return []
    low, high = min(h.score for h in hits), max(h.score for h in hits)
    if high == low:
        return [1.0] * len(hits)  # one score (or one hit): each is the list's best
    return [(h.score - low) / (high - low) for h in hits]
