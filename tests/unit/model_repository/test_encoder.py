from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers.model_modules import load_model_module

encoder = load_model_module("bge_onnx", "encoder")


def request(rows: int, length: int, start: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.arange(start, start + rows * length, dtype=np.int64).reshape(rows, length)
    return ids, np.ones_like(ids)


def test_stack_ragged_pads_every_request_to_the_longest() -> None:
    requests = [request(2, 3, 1), request(1, 5, 100), request(3, 1, 200)]
    ids, mask = encoder.stack_ragged([r[0] for r in requests], [r[1] for r in requests])
    assert ids.shape == mask.shape == (6, 5)
    assert ids[0].tolist() == [1, 2, 3, 0, 0] and mask[0].tolist() == [1, 1, 1, 0, 0]
    assert ids[2].tolist() == [100, 101, 102, 103, 104]
    assert mask.sum(axis=1).tolist() == [3, 3, 5, 1, 1, 1]


def test_split_rows_returns_each_request_its_rows_in_order() -> None:
    batch = np.arange(12, dtype=np.float32).reshape(6, 2)
    parts = encoder.split_rows(batch, [2, 1, 3])
    assert [p.shape for p in parts] == [(2, 2), (1, 2), (3, 2)]
    assert parts[1].tolist() == [[4.0, 5.0]]


@pytest.mark.parametrize(
    ("ids", "mask"),
    [(np.zeros((2, 3)), np.zeros((2, 4))), (np.zeros(3), np.zeros(3))],
)
def test_shape_error_names_both_shapes(ids: np.ndarray, mask: np.ndarray) -> None:
    assert f"INPUT_IDS {list(ids.shape)} and ATTENTION_MASK {list(mask.shape)}" in encoder.shape_error(ids, mask)
    assert encoder.shape_error(np.zeros((2, 3)), np.zeros((2, 3))) is None


def test_cpu_instances_run_int8_or_fp32_on_the_cpu_provider() -> None:
    plan = encoder.plan_session("CPU", 0, {"cpu_precision": "int8", "intra_op_threads": "3"}, "/tmp/trt")
    assert (plan.model_file, plan.providers[0][0], plan.intra_op_threads) == (
        "model_int8.onnx",
        "CPUExecutionProvider",
        3,
    )
    assert encoder.plan_session("CPU", 0, {"cpu_precision": "fp32"}, "/tmp/trt").model_file == "model.onnx"
    with pytest.raises(ValueError, match="cpu_precision must be one of"):
        encoder.plan_session("CPU", 0, {"cpu_precision": "fp16"}, "/tmp/trt")


def test_cpu_default_runs_one_single_threaded_run_per_core_this_process_may_use() -> None:
    cores = len(os.sched_getaffinity(0))
    plan = encoder.plan_session("CPU", 0, {"intra_op_threads": "0", "parallel_runs": "0"}, "")
    assert (plan.parallel_runs, plan.intra_op_threads) == (cores, 1)
    shared = encoder.plan_session("CPU", 0, {}, "", cpu_instances=cores * 2)
    assert (shared.parallel_runs, shared.intra_op_threads) == (1, 1)
    one_at_a_time = encoder.plan_session("CPU", 0, {"parallel_runs": "1"}, "")
    assert (one_at_a_time.parallel_runs, one_at_a_time.intra_op_threads) == (1, cores)
    assert encoder.plan_session("GPU", 0, {}, "").parallel_runs == 1  # one CUDA stream: runs in turn


def test_cpu_sessions_load_without_the_fused_skip_layer_norm_and_gpu_sessions_keep_every_fusion() -> None:
    for precision in ("int8", "fp32"):
        plan = encoder.plan_session("CPU", 0, {"cpu_precision": precision}, "")
        assert plan.disabled_optimizers == ("SkipLayerNormFusion",)
    assert encoder.plan_session("GPU", 0, {}, "/tmp/trt").disabled_optimizers == ()


@pytest.mark.parametrize("disabled", [(), encoder.CPU_DISABLED_OPTIMIZERS])
def test_the_disabled_optimizers_name_the_fusion_that_makes_skip_layer_norm(
    tmp_path: Path, disabled: tuple[str, ...]
) -> None:
    """onnxruntime ignores a name it does not know: the name must still be the transformer's that fuses a
    residual Add and a LayerNormalization, or the CPU sessions would quietly fuse it again."""
    shape = [1, 4, 8]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "skip"], ["sum"]),
            helper.make_node("LayerNormalization", ["sum", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-12),
        ],
        "residual",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name in ("x", "skip")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [
            numpy_helper.from_array(np.ones(8, np.float32), "gamma"),
            numpy_helper.from_array(np.zeros(8, np.float32), "beta"),
        ],
    )
    model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled)
    )
    operators = [node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node]
    assert operators == (["Add", "LayerNormalization"] if disabled else ["SkipLayerNormalization"])


def test_gpu_instances_run_fp16_on_cuda_or_tensorrt() -> None:
    cuda = encoder.plan_session("GPU", 1, {}, "/tmp/trt")
    assert cuda.model_file == "model_fp16.onnx" and cuda.providers == [("CUDAExecutionProvider", {"device_id": "1"})]
    trt = encoder.plan_session("GPU", 0, {"gpu_execution_provider": "tensorrt"}, "/tmp/trt")
    assert trt.model_file == "model.onnx"
    assert [name for name, _ in trt.providers] == ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
    assert trt.providers[0][1]["trt_fp16_enable"] == "True"


def test_chunk_sizes_bound_the_padding_of_each_chunk() -> None:
    assert encoder.chunk_sizes(np.array([9, 9, 9, 9])) == [4]  # equal lengths: no padding, one call
    assert encoder.chunk_sizes(np.array([3, 40, 41, 42])) == [1, 3]  # a short row is not padded to 40
    assert encoder.chunk_sizes(np.array([1, 2, 3, 4, 5, 6, 7]), padding_ratio=1.5) == [3, 4]
    assert encoder.chunk_sizes(np.array([], dtype=np.int64)) == []
    lengths = np.sort(np.random.default_rng(0).integers(5, 140, size=64))
    start = 0
    for size in encoder.chunk_sizes(lengths, 1.15):
        chunk = lengths[start : start + size]
        assert size == 1 or size * chunk.max() <= 1.15 * chunk.sum()
        start += size
    assert start == len(lengths)


def test_encode_by_length_pads_each_chunk_to_its_own_longest_and_keeps_request_order() -> None:
    # Three requests, right-padded to their own longest row, lengths 1..7 in mixed order.
    lengths = [[7, 2], [1], [5, 3, 6, 4]]
    ids, masks = [], []
    for rows in lengths:
        width = max(rows)
        mask = np.array([[1] * n + [0] * (width - n) for n in rows], dtype=np.int64)
        ids.append(mask * (np.arange(width) + 1) + 100 * mask.sum(axis=1, keepdims=True))
        masks.append(mask)
    calls: list[tuple[int, ...]] = []

    def run(batch_ids: np.ndarray, batch_mask: np.ndarray) -> np.ndarray:
        assert batch_ids.flags["C_CONTIGUOUS"] and batch_ids.shape == batch_mask.shape
        calls.append(tuple(batch_mask.sum(axis=1)))
        assert batch_ids.shape[1] == max(calls[-1])  # no padding beyond the chunk's longest row
        return np.stack([batch_mask.sum(axis=1), batch_ids[:, 0]], axis=1).astype(np.float32)

    parts = encoder.encode_by_length(run, ids, masks, padding_ratio=1.5)
    assert calls == [(1, 2, 3), (4, 5, 6, 7)]
    assert [p[:, 0].tolist() for p in parts] == [[7.0, 2.0], [1.0], [5.0, 3.0, 6.0, 4.0]]
    assert [p[:, 1].tolist() for p in parts] == [[701.0, 201.0], [101.0], [501.0, 301.0, 601.0, 401.0]]
    assert encoder.encode_by_length(run, [], []) == []


def test_balance_splits_chunks_larger_than_their_share() -> None:
    lengths = np.array([10] * 8 + [40, 40])
    chunks = [np.arange(8), np.array([8, 9])]  # costs 80 and 80: each is half of the whole
    assert [c.tolist() for c in encoder.balance(chunks, lengths, 2)] == [list(range(8)), [8, 9]]
    one = encoder.balance([np.arange(8)], lengths, 2)  # a single chunk would leave a worker idle
    assert [c.tolist() for c in one] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [c.tolist() for c in encoder.balance([np.array([8])], lengths, 4)] == [[8]]  # one row stays whole
    assert encoder.balance(chunks, lengths, 1) == chunks


def test_encode_by_length_runs_chunks_side_by_side_with_the_same_result() -> None:
    rng = np.random.default_rng(1)
    ids, masks = [], []
    for _ in range(12):
        rows, width = int(rng.integers(1, 4)), int(rng.integers(3, 60))
        mask = (np.arange(width) < rng.integers(1, width + 1, size=(rows, 1))).astype(np.int64)
        ids.append(mask * rng.integers(1, 1000, size=(rows, width)))
        masks.append(mask)
    barriers: list[threading.Barrier] = []
    calls = iter(range(1000))

    def run(batch_ids: np.ndarray, batch_mask: np.ndarray) -> np.ndarray:
        if barriers and next(calls) < 2:
            barriers[0].wait()  # the first two runs meet here: run one at a time, they would time out
        return np.stack([batch_mask.sum(axis=1), batch_ids.sum(axis=1)], axis=1).astype(np.float32)

    sequential = encoder.encode_by_length(run, ids, masks, 1.15)
    barriers.append(threading.Barrier(2, timeout=10))
    with ThreadPoolExecutor(2) as executor:
        parallel = encoder.encode_by_length(run, ids, masks, 1.15, executor, 2)
    assert [p.tolist() for p in parallel] == [p.tolist() for p in sequential]
    assert [p[:, 0].tolist() for p in parallel] == [m.sum(axis=1).tolist() for m in masks]


@pytest.mark.parametrize("pieces_per_worker", [encoder.PIECES_PER_WORKER, 3])
def test_encode_by_length_gives_each_worker_several_pieces(pieces_per_worker: int) -> None:
    """24 rows of one length are one chunk; two workers get it in pieces of at most 1/(2 x pieces_per_worker)
    of it each, taken from one queue, so a preempted run does not hold up the whole batch."""
    rows = 24
    mask = np.ones((rows, 20), dtype=np.int64)
    sizes: list[int] = []

    def run(batch_ids: np.ndarray, batch_mask: np.ndarray) -> np.ndarray:
        sizes.append(batch_ids.shape[0])
        return batch_ids[:, :1].astype(np.float32)

    ids = np.arange(rows * 20, dtype=np.int64).reshape(rows, 20)
    with ThreadPoolExecutor(2) as executor:
        (parallel,) = encoder.encode_by_length(run, [ids], [mask], 1.15, executor, 2, pieces_per_worker)
    assert len(sizes) >= 2 * pieces_per_worker and max(sizes) <= rows // (2 * pieces_per_worker)
    assert sum(sizes) == rows and parallel[:, 0].tolist() == ids[:, 0].tolist()


def test_gpu_instances_cap_the_cuda_memory_arena_as_the_export_configures_it() -> None:
    params = {"gpu_mem_limit": "8589934592", "arena_extend_strategy": "kSameAsRequested"}
    cuda = encoder.plan_session("GPU", 0, params, "/tmp/trt")
    assert cuda.providers == [("CUDAExecutionProvider", {"device_id": "0", **params})]
    trt = encoder.plan_session("GPU", 0, {**params, "gpu_execution_provider": "tensorrt"}, "/tmp/trt")
    assert trt.providers[1] == ("CUDAExecutionProvider", {"device_id": "0", **params})
    assert encoder.plan_session("CPU", 0, params, "").providers == [("CPUExecutionProvider", {})]
