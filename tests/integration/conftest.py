"""Triton fixtures for the integration tests: the exported MiniLM served INT8 and FP32, and the reference."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from export.checkpoint import Checkpoint
from export.repository import copy_with_config
from localtriton.server import TritonProcess
from tests.helpers.triton_configs import run_fp32


@pytest.fixture(scope="session")
def triton(minilm_repository: Path, triton_factory: Callable[[Path], TritonProcess]) -> TritonProcess:
    """Triton serving the exported MiniLM with the default (INT8) CPU encoder."""
    return triton_factory(minilm_repository)


@pytest.fixture(scope="session")
def triton_fp32(
    minilm_repository: Path, triton_factory: Callable[[Path], TritonProcess], tmp_path_factory: pytest.TempPathFactory
) -> TritonProcess:
    repository = copy_with_config(minilm_repository, tmp_path_factory.mktemp("fp32") / "repo", run_fp32)
    return triton_factory(repository)


@pytest.fixture(scope="session")
def reference(minilm: Checkpoint) -> Callable[[list[str]], np.ndarray]:
    """sentence-transformers on the same checkpoint: what the served model must reproduce."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm.path), device="cpu")
    model.max_seq_length = 512

    def encode(texts: list[str]) -> np.ndarray:
        return np.asarray(model.encode(texts, normalize_embeddings=True, show_progress_bar=False))

    return encode
