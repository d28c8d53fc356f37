"""KIND_GPU instances: FP16 on CUDA. Runs only where a GPU and onnxruntime-gpu are present."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from export.repository import copy_with_config
from localtriton.server import TritonProcess
from tests.helpers.sentences import CHINESE, ENGLISH
from tests.helpers.triton_configs import run_on_gpu
from tests.helpers.triton_embeddings import cosines, grpc_embed, text_batch

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_gpu_instance_serves_fp16_within_tolerance(
    minilm_repository: Path,
    triton_factory: Callable[[Path], TritonProcess],
    reference: Callable[[list[str]], np.ndarray],
    tmp_path: Path,
) -> None:
    server = triton_factory(copy_with_config(minilm_repository, tmp_path / "repo", run_on_gpu))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        served = grpc_embed(client, text_batch(ENGLISH + CHINESE)).as_numpy("EMBEDDING")
    assert cosines(served, reference(ENGLISH + CHINESE)).min() >= 0.999
