"""FP16 against FP32 in PyTorch: parity of the CLS-pooled, normalised embeddings, and throughput with p50 / p99
per call at batches of 1 to 128.

This needs nothing beyond the machine's own PyTorch, so it is the floor of what a lent machine measures. PyTorch
runs the checkpoint with its fused attention (SDPA), in FP16 as the GPU instances serve it: without Triton, its
queue, the tokenizer or the copies, its throughput is the upper bound of the served FP16 graph on that GPU.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from bench.gpu_check.latency import Sweep, sweep
from bench.gpu_check.model import ModelShape, cls_embedder, parity_lengths, token_rows
from bench.gpu_check.plan import Plan

if TYPE_CHECKING:
    import torch
    from transformers import BertModel

    from export.graph import SentenceEmbedder

PARITY_CHUNK = 16  # rows per forward pass in the parity check, padded to their longest


def cosines(reference: npt.NDArray[np.float32], other: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """Row-wise cosine similarity (the export's parity measure)."""
    a, b = reference.astype(np.float64), other.astype(np.float64)
    return np.asarray((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)), dtype=np.float64)


def parity_summary(reference: npt.NDArray[np.float32], other: npt.NDArray[np.float32]) -> dict[str, Any]:
    """Cosine min / mean and the largest element difference, against the FP16 tolerance the export holds to.

    A random checkpoint's vectors share one large common direction (`spread` is near 1), which alone keeps the
    plain cosine near 1. The centred cosine compares what is left once the reference rows' mean is taken off
    both: how well the differences between texts, which ranking reads, survive."""
    from export.config import DEFAULT_TOLERANCES, Precision

    tolerance = DEFAULT_TOLERANCES[Precision.FP16]
    cosine = cosines(reference, other)
    mean = reference.mean(axis=0, keepdims=True)
    centred = cosines(reference - mean, other - mean)
    return {
        "rows": len(cosine),
        "min_cosine": round(float(cosine.min()), 6),
        "mean_cosine": round(float(cosine.mean()), 6),
        "centred_min_cosine": round(float(centred.min()), 6),
        "centred_mean_cosine": round(float(centred.mean()), 6),
        "max_abs_diff": round(float(np.abs(reference - other).max()), 6),
        "threshold_min": tolerance.min_cosine,
        "threshold_mean": tolerance.mean_cosine,
        "passed": bool(cosine.min() >= tolerance.min_cosine and cosine.mean() >= tolerance.mean_cosine),
    }


def parity_line(what: str, parity: dict[str, Any]) -> str:
    return (
        f"{what}: cosine min {parity['min_cosine']} mean {parity['mean_cosine']}, centred min "
        f"{parity['centred_min_cosine']} mean {parity['centred_mean_cosine']} ({parity['rows']} rows)"
    )


def spread(reference: npt.NDArray[np.float32]) -> float:
    """Mean cosine between different rows: near 1 would mean a collapsed model, whose parity proves nothing."""
    normed = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    similarity = normed @ normed.T
    count = len(reference)
    return float((similarity.sum() - np.trace(similarity)) / max(1, count * (count - 1)))


class ParityRows:
    """The parity check's random rows (lengths 8 to the model's limit) and their FP32 embeddings."""

    def __init__(self, shape: ModelShape, seed: int, rows: int) -> None:
        import torch

        generator = torch.Generator().manual_seed(seed)
        lengths = parity_lengths(shape, rows, generator)
        self.chunks = [
            token_rows(shape, lengths[i : i + PARITY_CHUNK], generator) for i in range(0, rows, PARITY_CHUNK)
        ]
        self.reference: npt.NDArray[np.float32] | None = None

    def embed(self, run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> npt.NDArray[np.float32]:
        import torch

        with torch.inference_mode():
            parts = [run(ids, mask).float().cpu().numpy() for ids, mask in self.chunks]
        joined: npt.NDArray[np.float32] = np.concatenate(parts).astype(np.float32)
        return joined


def fp32_reference(encoder: BertModel, rows: ParityRows) -> npt.NDArray[np.float32]:
    """The parity rows' FP32 vectors on the GPU where there is one (the torch step's, when it did not run)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = cls_embedder(encoder).to(device)
    try:
        return rows.embed(on_device(model, device))
    finally:
        model.to("cpu")  # the encoder is shared with the later steps, which expect it on the CPU


def on_device(embedder: SentenceEmbedder, device: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    return lambda ids, mask: embedder(ids.to(device), mask.to(device))


def timed_call(
    embedder: SentenceEmbedder, shape: ModelShape, device: str, seed: int
) -> Callable[[int, int], Callable[[], None]]:
    """For (batch, tokens): a call that embeds one full batch of random rows and waits for the device."""
    import torch

    def make(batch: int, tokens: int) -> Callable[[], None]:
        generator = torch.Generator().manual_seed(seed + batch * 1000 + tokens)
        ids, mask = (t.to(device) for t in token_rows(shape, [tokens] * batch, generator))

        def call() -> None:
            with torch.inference_mode():
                embedder(ids, mask)
            if device == "cuda":
                torch.cuda.synchronize()

        return call

    return make


def run(
    encoder: BertModel,
    plan: Plan,
    device: str,
    rows: ParityRows,
    deadline: float,
    say: Callable[[str], None],
    seed: int = 0,
) -> dict[str, Any]:
    """Parity, then the FP16 sweep (about 55 % of the time to `deadline`), then FP32's in what is left."""
    import torch

    started = time.monotonic()
    shape = plan.shape
    fp32 = _copy_to(encoder, device, torch.float32)
    fp16 = _copy_to(encoder, device, torch.float16)
    rows.reference = rows.embed(on_device(fp32, device))
    half = rows.embed(on_device(fp16, device))
    parity = {**parity_summary(rows.reference, half), "between_rows_mean_cosine": round(spread(rows.reference), 4)}
    say(parity_line("torch parity FP16 vs FP32", parity))
    sizes = (plan.batches, plan.lengths, plan.window)
    fp16_until = started + 0.55 * (deadline - started)
    fp16_sweep = sweep(f"torch FP16 {device}", timed_call(fp16, shape, device, seed), *sizes, fp16_until, say)
    fp32_sweep = sweep(f"torch FP32 {device}", timed_call(fp32, shape, device, seed), *sizes, deadline, say)
    return {
        "device": _device_name(device),
        "attention": "sdpa",
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "parity_fp16_vs_fp32": parity,
        "fp16": fp16_sweep.as_dict(),
        "fp32": fp32_sweep.as_dict(),
        "fp16_speedup": speedups(fp16_sweep, fp32_sweep),
    }


def _copy_to(encoder: BertModel, device: str, dtype: torch.dtype) -> SentenceEmbedder:
    import torch

    copied = copy.deepcopy(encoder)
    copied.set_attn_implementation("sdpa")
    return cls_embedder(torch.nn.Module.to(copied, device=device, dtype=dtype))


def speedups(fast: Sweep, slow: Sweep) -> dict[str, float]:
    """FP16 rows/s over FP32's, per shape both measured."""
    slow_rates = {(p.batch, p.tokens): p.per_second for p in slow.points}
    return {
        f"{p.batch}x{p.tokens}": round(p.per_second / slow_rates[(p.batch, p.tokens)], 2)
        for p in fast.points
        if (p.batch, p.tokens) in slow_rates
    }


def _device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return f"cpu (torch {torch.__version__})"
