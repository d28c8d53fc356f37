"""Calling the served `bge` model on Triton directly (no gateway), and comparing what comes back."""

from __future__ import annotations

import numpy as np
import tritonclient.grpc as grpcclient

from localtriton.server import TritonProcess


def text_batch(texts: list[str]) -> np.ndarray:
    return np.array([[t.encode("utf-8")] for t in texts], dtype=object)


def grpc_embed(client: grpcclient.InferenceServerClient, raw: np.ndarray) -> grpcclient.InferResult:
    text = grpcclient.InferInput("TEXT", list(raw.shape), "BYTES")
    text.set_data_from_numpy(raw)
    return client.infer("bge", [text])


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def triton_direct(triton: TritonProcess, texts: list[str]) -> tuple[np.ndarray, int]:
    """Triton's own vectors and token total for `texts` (chunks of 64)."""
    vectors, tokens = [], 0
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        for start in range(0, len(texts), 64):
            result = grpc_embed(client, text_batch(texts[start : start + 64]))
            vectors.append(result.as_numpy("EMBEDDING"))
            tokens += int(result.as_numpy("TOKEN_COUNT").sum())
    return np.concatenate(vectors), tokens


def triton_requests(triton: TritonProcess, model: str = "bge") -> int:
    """Requests Triton has executed for `model` so far (moves only when the gateway calls it)."""
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return int(stats["inference_stats"]["success"].get("count", 0))
