from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from export.checkpoint import Checkpoint
from export.repository import ENCODER, parse, render
from localtriton.server import TritonProcess


def with_cpu_precision(source: Path, dest: Path, precision: str) -> Path:
    """A hard-linked copy of `source` whose encoder runs the `precision` graph."""
    shutil.copytree(source, dest, copy_function=os.link)
    config_file = dest / ENCODER / "config.pbtxt"
    config = parse(config_file.read_text())
    config.parameters["cpu_precision"].string_value = precision
    config_file.unlink()  # a hard link: do not write through to the source
    config_file.write_text(render(config))
    return dest


@pytest.fixture(scope="session")
def triton(minilm_repository: Path, triton_factory: Callable[[Path], TritonProcess]) -> TritonProcess:
    """Triton serving the exported MiniLM with the default (INT8) CPU encoder."""
    return triton_factory(minilm_repository)


@pytest.fixture(scope="session")
def triton_fp32(
    minilm_repository: Path, triton_factory: Callable[[Path], TritonProcess], tmp_path_factory: pytest.TempPathFactory
) -> TritonProcess:
    repository = with_cpu_precision(minilm_repository, tmp_path_factory.mktemp("fp32") / "repo", "fp32")
    return triton_factory(repository)


@pytest.fixture
def grpc_client(triton: TritonProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    yield client
    client.close()


@pytest.fixture
def http_client(triton: TritonProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(triton.http_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def reference(minilm: Checkpoint) -> Callable[[list[str]], np.ndarray]:
    """sentence-transformers on the same checkpoint: what the served model must reproduce."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm.path), device="cpu")
    model.max_seq_length = 512

    def encode(texts: list[str]) -> np.ndarray:
        return np.asarray(model.encode(texts, normalize_embeddings=True, show_progress_bar=False))

    return encode
