"""Tensor and session logic of `bge_onnx`, free of Triton so it can be unit-tested."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

CPU_FILES = {"int8": "model_int8.onnx", "fp32": "model.onnx"}
# After sorting by length, a chunk (one ONNX Runtime call) grows while its padded area stays within this
# multiple of its real tokens. It trades padding waste (a ratio too high) against many small matrix
# products (too low), and beat chunks of a fixed number of rows on dynamic batches of mixed lengths.
PADDING_RATIO = 1.15
# Runs side by side take a batch's chunks from one queue, in pieces of at most 1/(workers x this) of the
# batch: when another process preempts one run, the other worker takes the remaining pieces instead of
# waiting for it at the batch's end. More pieces balance the workers better, but each is a smaller, less
# efficient run. Served, where the tokenizer, Triton and the gateway share the cores, 6 beat 3 on batches
# of 32-text requests and matched it on single texts; alone in a process, where no run is preempted, 3
# does best (see docs/benchmarks.md).
PIECES_PER_WORKER = 6
# onnxruntime's session fusions skipped on the CPU provider. Its fused SkipLayerNormalization kernel runs
# slower on the CPU than the Add and LayerNormalization it replaces: without it the INT8 graph costs about a
# sixth less CPU per text, its vectors as close to the FP32 graph's (docs/benchmarks.md).
CPU_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


@dataclass(frozen=True)
class SessionPlan:
    """Which graph to load and on which execution providers."""

    model_file: str
    providers: list[tuple[str, dict[str, str]]]
    intra_op_threads: int
    spin: bool = False
    parallel_runs: int = 1  # session runs at once, each on its own thread (chunks of one batch)
    disabled_optimizers: tuple[str, ...] = ()  # onnxruntime graph transformers left out, by name


def plan_session(
    kind: str, device_id: int, params: dict[str, str], cache_dir: str, cpu_instances: int = 1
) -> SessionPlan:
    """KIND_CPU: INT8 (or FP32) on the CPU provider; KIND_GPU: FP16 on CUDA, or TensorRT building FP16 engines.

    On the CPU a batch's chunks run side by side by default, one single-threaded run per core (`parallel_runs`):
    the chunks of a dynamic batch are small (a few rows of similar length), where ONNX Runtime's threads spend
    much of each run waiting for one another, so runs side by side serve more texts/s than one run at a
    time on every thread, at a lower latency per batch."""
    cores = cores_per_instance(cpu_instances)
    parallel = int(params.get("parallel_runs", "0")) or (cores if kind == "CPU" else 1)
    threads = int(params.get("intra_op_threads", "0")) or max(1, cores // parallel)
    spin = params.get("allow_spinning", "false").lower() in ("1", "true", "yes")
    if kind == "GPU":
        cuda = ("CUDAExecutionProvider", {"device_id": str(device_id), **arena_options(params)})
        if params.get("gpu_execution_provider", "cuda") == "tensorrt":
            tensorrt = (
                "TensorrtExecutionProvider",
                {
                    "device_id": str(device_id),
                    "trt_fp16_enable": "True",
                    "trt_engine_cache_enable": "True",
                    "trt_engine_cache_path": cache_dir,
                },
            )
            return SessionPlan("model.onnx", [tensorrt, cuda], threads, spin, parallel)
        return SessionPlan("model_fp16.onnx", [cuda], threads, spin, parallel)
    precision = params.get("cpu_precision", "int8")
    if precision not in CPU_FILES:
        raise ValueError(f"cpu_precision must be one of {sorted(CPU_FILES)}, got {precision!r}")
    cpu = [("CPUExecutionProvider", {})]
    return SessionPlan(CPU_FILES[precision], cpu, threads, spin, parallel, CPU_DISABLED_OPTIMIZERS)


def arena_options(params: dict[str, str]) -> dict[str, str]:
    """The CUDA provider's memory arena as the export configures it: capped (`gpu_mem_limit`, bytes) and grown by what
    a run asks for (`arena_extend_strategy`), so that a model never holds more of the GPU than its budget."""
    return {key: params[key] for key in ("gpu_mem_limit", "arena_extend_strategy") if params.get(key)}


def cores_per_instance(cpu_instances: int) -> int:
    """The cores this process may run on (its affinity mask), shared by the CPU instances
    so that they do not oversubscribe the cores."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, cpu_instances))


def create_session(model_path: str, plan: SessionPlan) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = plan.intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Spinning workers keep a core busy between runs; on a CPU shared with the tokenizer, Triton and
    # the gateway that costs more than the wake-up latency it saves.
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if plan.spin else "0")
    names = [name for name, _ in plan.providers]
    return ort.InferenceSession(
        model_path,
        options,
        providers=names,
        provider_options=[o for _, o in plan.providers],
        disabled_optimizers=list(plan.disabled_optimizers),
    )


def shape_error(input_ids: np.ndarray, attention_mask: np.ndarray) -> str | None:
    """Why one request's pair of token arrays cannot be run, or None."""
    if input_ids.ndim != 2 or input_ids.shape != attention_mask.shape:
        return (
            f"INPUT_IDS {list(input_ids.shape)} and ATTENTION_MASK {list(attention_mask.shape)} must be equal [n, len]"
        )
    return None


def stack_ragged(input_ids: list[np.ndarray], attention_mask: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Requests of [rows_i, len_i] -> one [sum rows_i, max len_i] batch, zero-padded on the right."""
    rows = sum(ids.shape[0] for ids in input_ids)
    width = max((ids.shape[1] for ids in input_ids), default=0)
    ids_out = np.zeros((rows, width), dtype=np.int64)
    mask_out = np.zeros((rows, width), dtype=np.int64)
    row = 0
    for ids, mask in zip(input_ids, attention_mask, strict=True):
        ids_out[row : row + ids.shape[0], : ids.shape[1]] = ids
        mask_out[row : row + ids.shape[0], : ids.shape[1]] = mask
        row += ids.shape[0]
    return ids_out, mask_out


def split_rows(batch: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    """Undo `stack_ragged` on the output: one [rows_i, dim] array per request, in order."""
    return np.split(batch, np.cumsum(sizes)[:-1]) if sizes else []


def chunk_sizes(sorted_lengths: np.ndarray, padding_ratio: float = PADDING_RATIO) -> list[int]:
    """Split rows sorted by length into runs whose padded area (rows x longest) stays within
    `padding_ratio` x their real tokens; a row is never alone unless the next would break the bound."""
    sizes, start, count = [], 0, len(sorted_lengths)
    while start < count:
        end, tokens = start + 1, int(sorted_lengths[start])
        while end < count:
            tokens += int(sorted_lengths[end])
            if (end + 1 - start) * int(sorted_lengths[end]) > padding_ratio * tokens:
                break
            end += 1
        sizes.append(end - start)
        start = end
    return sizes


def padded_area(rows: np.ndarray, lengths: np.ndarray) -> int:
    """What a chunk costs to run: its rows x its longest row."""
    return len(rows) * int(lengths[rows].max())


def balance(chunks: list[np.ndarray], lengths: np.ndarray, pieces: int) -> list[np.ndarray]:
    """Split the costliest chunk (`padded_area`) in two while it is more than 1/`pieces` of the whole,
    so that runs side by side finish together; a chunk's rows stay sorted by length."""
    chunks = list(chunks)
    if pieces <= 1 or not chunks:
        return chunks
    share = sum(padded_area(rows, lengths) for rows in chunks) / pieces
    while True:
        largest = max(range(len(chunks)), key=lambda i: padded_area(chunks[i], lengths))
        rows = chunks[largest]
        if len(rows) < 2 or padded_area(rows, lengths) <= share:
            return chunks
        half = len(rows) // 2
        chunks[largest : largest + 1] = [rows[:half], rows[half:]]


def encode_by_length(
    run: Callable[[np.ndarray, np.ndarray], np.ndarray],
    input_ids: list[np.ndarray],
    attention_mask: list[np.ndarray],
    padding_ratio: float = PADDING_RATIO,
    executor: Executor | None = None,
    workers: int = 1,
    pieces_per_worker: int = PIECES_PER_WORKER,
) -> list[np.ndarray]:
    """Every request's rows, sorted by token length and run in chunks of similar length (`chunk_sizes`),
    each call padded only to its own longest row (a dynamic batch in arrival order pads every row to the
    batch's longest). With an `executor` of `workers` threads the chunks run side by side, costliest first
    (`balance` cuts them into `pieces_per_worker` pieces per worker). Returns one [rows_i, dim] array per
    request, in order. Rows are right-padded."""
    ids, mask = stack_ragged(input_ids, attention_mask)
    lengths = mask.sum(axis=1)
    order = np.argsort(lengths, kind="stable")
    sizes = chunk_sizes(lengths[order], padding_ratio)
    chunks = np.split(order, np.cumsum(sizes)[:-1]) if sizes else []

    def call(rows: np.ndarray) -> np.ndarray:
        width = max(int(lengths[rows].max()), 1)
        return run(np.ascontiguousarray(ids[rows, :width]), np.ascontiguousarray(mask[rows, :width]))

    if executor is not None and workers > 1:
        chunks = sorted(
            balance(chunks, lengths, workers * pieces_per_worker), key=lambda rows: -padded_area(rows, lengths)
        )
        parts = list(executor.map(call, chunks))
    else:
        parts = [call(rows) for rows in chunks]
    if not parts:
        return []
    outputs = np.empty((len(order), parts[0].shape[1]), dtype=np.float32)
    for rows, part in zip(chunks, parts, strict=True):
        outputs[rows] = part
    return split_rows(outputs, [i.shape[0] for i in input_ids])
