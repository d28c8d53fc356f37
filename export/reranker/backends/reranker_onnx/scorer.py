"""Tensor logic of `reranker_onnx`, free of Triton: a dynamic batch's pairs, sorted by length and run in chunks
of similar length as `bge_onnx` runs its texts (`encoder.chunk_sizes`, `encoder.balance`, copied beside this
module at install), with any number of token tensors (TOKEN_TYPE_IDS where the model has token types)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor

import numpy as np
import numpy.typing as npt
from encoder import PADDING_RATIO, PIECES_PER_WORKER, balance, chunk_sizes, padded_area

Features = dict[str, npt.NDArray[np.int64]]
Scores = npt.NDArray[np.float32]


def shape_error(features: Features) -> str | None:
    """Why one request's token arrays cannot be run, or None."""
    shapes = {name: list(array.shape) for name, array in features.items()}
    first = next(iter(features.values()))
    if first.ndim != 2 or any(array.shape != first.shape for array in features.values()):
        return f"token tensors must all be equal [n, len]: {shapes}"
    return None


def stack_ragged(requests: list[Features]) -> Features:
    """Requests of [rows_i, len_i] per tensor -> one [sum rows_i, max len_i] array per tensor, zero-padded on the
    right (padded positions are masked: their value never reaches a score)."""
    rows = sum(next(iter(r.values())).shape[0] for r in requests)
    width = max(next(iter(r.values())).shape[1] for r in requests)
    stacked = {name: np.zeros((rows, width), dtype=np.int64) for name in requests[0]}
    row = 0
    for request in requests:
        height, length = request["ATTENTION_MASK"].shape
        for name, array in request.items():
            stacked[name][row : row + height, :length] = array
        row += height
    return stacked


def score_by_length(
    run: Callable[[Features], Scores],
    requests: list[Features],
    padding_ratio: float = PADDING_RATIO,
    executor: Executor | None = None,
    workers: int = 1,
    pieces_per_worker: int = PIECES_PER_WORKER,
) -> list[Scores]:
    """Every request's rows, sorted by token length and run in chunks of similar length, each call padded only to
    its own longest row; with an `executor` of `workers` threads the chunks run side by side, costliest first.
    Returns one [rows_i, 1] array per request, in order."""
    if not requests:
        return []
    features = stack_ragged(requests)
    lengths = features["ATTENTION_MASK"].sum(axis=1)
    order = np.argsort(lengths, kind="stable")
    sizes = chunk_sizes(lengths[order], padding_ratio)
    chunks = np.split(order, np.cumsum(sizes)[:-1])

    def call(rows: npt.NDArray[np.intp]) -> Scores:
        width = max(int(lengths[rows].max()), 1)
        return run({name: np.ascontiguousarray(array[rows, :width]) for name, array in features.items()})

    if executor is not None and workers > 1:
        chunks = sorted(
            balance(chunks, lengths, workers * pieces_per_worker), key=lambda rows: -padded_area(rows, lengths)
        )
        parts = list(executor.map(call, chunks))
    else:
        parts = [call(rows) for rows in chunks]
    scores = np.empty((len(order), 1), dtype=np.float32)
    for rows, part in zip(chunks, parts, strict=True):
        scores[rows] = part
    return np.split(scores, np.cumsum([r["ATTENTION_MASK"].shape[0] for r in requests])[:-1])
