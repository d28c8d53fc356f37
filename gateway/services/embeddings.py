"""Embeddings, framework-free: validation, per-text cache, one Triton call for the misses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

CacheOutcome = Literal["hit", "miss", "partial"]


@dataclass(frozen=True)
class EmbeddingResult:
    vectors: npt.NDArray[np.float32]  # [texts, dimension], L2-normalised, in input order
    model: str  # the served checkpoint's name, e.g. "BAAI/bge-large-zh-v1.5"
    prompt_tokens: int  # tokens the model saw, special tokens included
    truncated_texts: int  # texts cut at the model's maximum length
    cache: CacheOutcome
