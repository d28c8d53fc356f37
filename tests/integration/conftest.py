"""Triton fixtures for the integration tests: the exported MiniLM served INT8 and FP32 (the latter with a tiny
reranker beside it), and the reference."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from export.checkpoint import Checkpoint
from export.repository import copy_with_config
from export.reranker.pipeline import main_export as export_reranker
from localtriton.server import TritonProcess
from tests.helpers.cross_encoders import bert_cross_encoder
from tests.helpers.triton_configs import run_fp32


@pytest.fixture(scope="session")
def triton(minilm_repository: Path, triton_factory: Callable[[Path], TritonProcess]) -> TritonProcess:
    """Triton serving the exported MiniLM with the default (INT8) CPU encoder."""
    return triton_factory(minilm_repository)


RERANKER_MAX_LENGTH = 128


@pytest.fixture(scope="session")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory, minilm: Checkpoint) -> Path:
    """A tiny random BERT cross-encoder (no reranker weights are reachable offline)."""
    return bert_cross_encoder(tmp_path_factory.mktemp("reranker-checkpoint"), minilm, RERANKER_MAX_LENGTH)


@pytest.fixture(scope="session")
def triton_fp32(
    minilm_repository: Path,
    cross_encoder: Path,
    triton_factory: Callable[[Path], TritonProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> TritonProcess:
    """MiniLM on its FP32 graph, and the reranker exported beside it on its own FP32 graph: scores that can be held
    to sentence-transformers' (embeddings and CrossEncoder alike)."""
    exported = tmp_path_factory.mktemp("reranking") / "model_repository"
    shutil.copytree(minilm_repository, exported, copy_function=os.link)  # the files linked, not copied
    export_reranker(str(cross_encoder), exported, max_length=RERANKER_MAX_LENGTH, work_dir=tmp_path_factory.mktemp("w"))
    fp32 = copy_with_config(exported, tmp_path_factory.mktemp("fp32") / "repo", run_fp32)
    return triton_factory(copy_with_config(fp32, tmp_path_factory.mktemp("fp32-reranker") / "repo", run_fp32,
                                           model="reranker_onnx"))  # fmt: skip


@pytest.fixture(scope="session")
def reference(minilm: Checkpoint) -> Callable[[list[str]], np.ndarray]:
    """sentence-transformers on the same checkpoint: what the served model must reproduce."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm.path), device="cpu")
    model.max_seq_length = 512

    def encode(texts: list[str]) -> np.ndarray:
        return np.asarray(model.encode(texts, normalize_embeddings=True, show_progress_bar=False))

    return encode
