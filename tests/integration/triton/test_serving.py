"""The real `tritonserver` serving `bge` from the real MiniLM export."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from export.repository import MAX_BATCH_SIZE
from localtriton.server import TritonProcess
from tests.helpers.sentences import CHINESE, ENGLISH
from tests.helpers.triton_embeddings import cosines, grpc_embed, text_batch

pytestmark = pytest.mark.slow


def http_embed(client: httpclient.InferenceServerClient, raw: np.ndarray) -> httpclient.InferResult:
    text = httpclient.InferInput("TEXT", list(raw.shape), "BYTES")
    text.set_data_from_numpy(raw)
    return client.infer("bge", [text])


def test_bge_answers_the_same_over_grpc_and_http(
    grpc_client: grpcclient.InferenceServerClient, http_client: httpclient.InferenceServerClient
) -> None:
    raw = text_batch(ENGLISH + CHINESE)
    over_grpc = grpc_embed(grpc_client, raw).as_numpy("EMBEDDING")
    over_http = http_embed(http_client, raw).as_numpy("EMBEDDING")
    assert over_grpc.shape == over_http.shape == (6, 384)
    assert over_grpc.dtype == np.float32
    np.testing.assert_allclose(over_grpc, over_http, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(over_grpc, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize(("server", "min_cosine"), [("triton", 0.96), ("triton_fp32", 0.999)])
def test_embeddings_match_the_pytorch_reference(
    server: str, min_cosine: float, request: pytest.FixtureRequest, reference: Callable[[list[str]], np.ndarray]
) -> None:
    triton: TritonProcess = request.getfixturevalue(server)
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        served = grpc_embed(client, text_batch(ENGLISH + CHINESE)).as_numpy("EMBEDDING")
    similarity = cosines(served, reference(ENGLISH + CHINESE))
    assert similarity.min() >= min_cosine, similarity
    np.testing.assert_allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-5)


def test_revision_and_limits_are_in_the_model_config(
    grpc_client: grpcclient.InferenceServerClient, minilm_repository: Path
) -> None:
    import json

    report = json.loads((minilm_repository / "bge_onnx" / "1" / "parity.json").read_text())
    config = grpc_client.get_model_config("bge", as_json=True)["config"]
    assert config["parameters"]["model_revision"]["string_value"] == report["revision"]
    assert config["parameters"]["max_sequence_length"]["string_value"] == "512"
    assert int(config["max_batch_size"]) >= 64


def inference_stats(client: grpcclient.InferenceServerClient, model: str) -> tuple[int, int]:
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))


async def embed_concurrently(url: str, texts: list[str]) -> list[np.ndarray]:
    client = grpcaio.InferenceServerClient(url)

    async def one(text: str) -> np.ndarray:
        tensor = grpcaio.InferInput("TEXT", [1, 1], "BYTES")
        tensor.set_data_from_numpy(text_batch([text]))
        result = await client.infer("bge", [tensor])
        return result.as_numpy("EMBEDDING")[0]

    try:
        return list(await asyncio.gather(*(one(t) for t in texts)))
    finally:
        await client.close()


async def test_concurrent_requests_of_different_lengths_batch_together(
    triton_fp32: TritonProcess, reference: Callable[[list[str]], np.ndarray]
) -> None:
    # 64 single-text requests, no two of the same token length: only ragged batching can group them.
    texts = [" ".join(["word"] * (i + 1)) + f" number {i}" for i in range(64)]
    with grpcclient.InferenceServerClient(triton_fp32.grpc_url) as client:
        inferences_before, executions_before = inference_stats(client, "bge_onnx")
        served = np.stack(await embed_concurrently(triton_fp32.grpc_url, texts))
        inferences, executions = inference_stats(client, "bge_onnx")
    assert inferences - inferences_before == 64
    assert executions - executions_before < 64
    # Padding to the batch's longest request must not change any text's vector.
    assert cosines(served, reference(texts)).min() >= 0.999


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "text 0 is empty or only whitespace"),
        (b"  \n\t ", "text 0 is empty or only whitespace"),
        (b"caf\xe9 \xff", "text 0 is not valid UTF-8"),
    ],
    ids=["empty", "whitespace", "invalid-utf8"],
)
def test_bad_text_gets_a_clear_error_and_the_server_stays_up(
    raw: bytes,
    message: str,
    grpc_client: grpcclient.InferenceServerClient,
    http_client: httpclient.InferenceServerClient,
) -> None:
    bad = np.array([[raw]], dtype=object)
    with pytest.raises(InferenceServerException, match=message) as over_grpc:
        grpc_embed(grpc_client, bad)
    assert over_grpc.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match=message) as over_http:
        http_embed(http_client, bad)
    assert over_http.value.status() == "400"
    assert grpc_client.is_server_live() and grpc_client.is_model_ready("bge")
    assert grpc_embed(grpc_client, text_batch(["still serving"])).as_numpy("EMBEDDING").shape == (1, 384)


async def test_one_bad_text_fails_only_its_own_request(triton: TritonProcess) -> None:
    client = grpcaio.InferenceServerClient(triton.grpc_url)

    async def one(raw: np.ndarray) -> object:
        tensor = grpcaio.InferInput("TEXT", list(raw.shape), "BYTES")
        tensor.set_data_from_numpy(raw)
        try:
            return (await client.infer("bge", [tensor])).as_numpy("EMBEDDING")
        except InferenceServerException as exc:
            return exc

    try:
        batches = [text_batch([f"good text {i}"]) for i in range(8)]
        batches.insert(4, np.array([[b"ok"], [b""]], dtype=object))
        results = list(await asyncio.gather(*(one(b) for b in batches)))
    finally:
        await client.close()
    assert isinstance(results[4], InferenceServerException) and "text 1 is empty" in str(results[4])
    assert all(isinstance(r, np.ndarray) and r.shape == (1, 384) for i, r in enumerate(results) if i != 4)


def test_very_long_text_is_truncated_and_reported(grpc_client: grpcclient.InferenceServerClient) -> None:
    long_text = ("All work and no play makes Jack a dull boy. " * 2300)[:100_000]
    result = grpc_embed(grpc_client, text_batch([long_text, "short"]))
    assert result.as_numpy("TRUNCATED").ravel().tolist() == [True, False]
    assert result.as_numpy("TOKEN_COUNT").ravel().tolist() == [512, 3]
    np.testing.assert_allclose(np.linalg.norm(result.as_numpy("EMBEDDING"), axis=1), 1.0, atol=1e-5)


def test_batch_above_max_batch_size_is_refused(grpc_client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match=f"batch-size must be <= {MAX_BATCH_SIZE}"):
        grpc_embed(grpc_client, text_batch([f"text {i}" for i in range(MAX_BATCH_SIZE + 1)]))
    full = grpc_embed(grpc_client, text_batch([f"text {i}" for i in range(MAX_BATCH_SIZE)]))
    assert full.as_numpy("EMBEDDING").shape == (MAX_BATCH_SIZE, 384)
