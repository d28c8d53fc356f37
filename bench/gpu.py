"""GPU part of `make bench`, run by `bench/gpu.sh` on a machine with an NVIDIA GPU.

Triton serves the `bge` ensemble with `bge_onnx` as a KIND_GPU instance (the FP16 graph on ONNX
Runtime's CUDA provider; the tokenizer stays on the CPU), and tritonclient's asyncio gRPC client
sends the workload's texts in batches of 1 to 128, one batch in flight and then four, so that
Triton's dynamic batcher has something to merge. A batch above the ensemble's max_batch_size
(`MAX_BATCH_SIZE`) would go as several requests of that size at once.

Without a GPU (no working `nvidia-smi`) or without onnxruntime-gpu the part measures nothing and the
report says why: GPU numbers are measured, never estimated.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.cpu import CpuWindow
from bench.embeddings.loads import Series, batches, measure_triton
from bench.embeddings.repository import checkpoint_for, require_export
from bench.progress import PartProgress
from bench.results import PartResult, Point
from bench.run_stats import RunStats
from bench.stack import REPOSITORY, triton
from bench.triton_stats import MODEL
from bench.workload import texts as workload_texts
from export.repository import MAX_BATCH_SIZE, copy_with_config

PART = "gpu"
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
BATCHES_IN_FLIGHT = (1, 4)
QUICK_TEXTS = 256


def nvidia_gpu_missing() -> str | None:
    """Why this machine has no usable NVIDIA GPU, or None."""
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU on this machine (nvidia-smi not found)"
    probe = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    if probe.returncode != 0 or "GPU" not in probe.stdout:
        return f"no usable NVIDIA GPU (nvidia-smi -L: {(probe.stderr or probe.stdout).strip()[:200]})"
    return None


def gpu_unavailable() -> str | None:
    """Why the GPU part cannot run here, or None."""
    missing = nvidia_gpu_missing()
    if missing is not None:
        return missing
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return "onnxruntime has no CUDA provider: install onnxruntime-gpu (bench/gpu.sh does)"
    return None


def gpu_names() -> str:
    query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    lines = subprocess.run(query, capture_output=True, text=True, check=True).stdout.splitlines()
    return "; ".join(line.strip() for line in lines if line.strip())


def gpu_repository(source: Path, dest: Path) -> Path:
    """A copy of the exported repository (files linked) with `bge_onnx` on KIND_GPU; the tokenizer stays on the CPU."""
    from tritonclient.grpc import model_config_pb2 as mc

    def on_gpu(config: mc.ModelConfig) -> None:
        for group in config.instance_group:
            group.kind = mc.ModelInstanceGroup.KIND_GPU

    shutil.rmtree(dest, ignore_errors=True)
    return copy_with_config(source, dest, on_gpu)


def requests_for(texts: list[str], batch_size: int, in_flight: int) -> tuple[list[list[str]], int]:
    """The requests of one load and how many to keep in flight: `in_flight` batches of `batch_size`."""
    per_request = min(batch_size, MAX_BATCH_SIZE)  # the ensemble's max_batch_size
    return batches(texts, per_request), in_flight * max(1, batch_size // per_request)


def series_name(in_flight: int) -> str:
    return f"Triton gRPC, bge_onnx FP16 on CUDA, {in_flight} batch{'es' if in_flight > 1 else ''} in flight"


async def run(
    out_dir: Path,
    *,
    runs: int = 3,
    quick: bool = False,
    repository: Path = REPOSITORY,
    progress: PartProgress | None = None,
) -> PartResult:
    result = PartResult(part=PART, x_label="batch size (texts)", throughput_unit="texts/s")
    reason = gpu_unavailable()
    if reason is not None:
        result.notes.append(f"No GPU numbers: {reason}. Run bench/gpu.sh on a machine with an NVIDIA GPU.")
        return result
    require_export(repository)
    if not (repository / "bge_onnx" / "1" / "model_fp16.onnx").is_file():
        raise FileNotFoundError("no FP16 graph (bge_onnx/1/model_fp16.onnx): run `make export` first")
    checkpoint = checkpoint_for(repository, None)
    texts = workload_texts()[: QUICK_TEXTS if quick else None]
    runs = 1 if quick else runs
    log_dir = out_dir / "logs" / PART
    endpoint = triton(log_dir, gpu_repository(repository, log_dir / "repository"))
    server = endpoint.server
    series: dict[tuple[int, int], Series] = {}
    began = time.monotonic()
    server.start(endpoint.ready_url, timeout=600)  # TensorRT-free, but CUDA's start-up is slow
    try:
        for _ in range(runs):
            for in_flight in BATCHES_IN_FLIGHT:
                for batch_size in BATCH_SIZES:
                    requests, concurrency = requests_for(texts, batch_size, in_flight)
                    stats, window, counters = await measure_triton(endpoint, requests, concurrency)
                    record(series, in_flight, batch_size, stats, window, counters)
                server.check_alive()
            if progress is not None:
                progress.advance()
    finally:
        server.stop()
    result.points = [item.point() for item in series.values()]
    result.table = [table_row(point) for point in result.points]
    result.notes += [
        f"GPU: {gpu_names()}; model {checkpoint.name}; {len(texts)} texts (half English, half Chinese); "
        f"medians of {runs} runs; client: tritonclient.grpc.aio in the bench process",
        f"Triton from the nvidia-pytriton wheel, python backend, ONNX Runtime CUDA provider; log {server.log_path}",
        f"gpu part took {time.monotonic() - began:.0f} s",
    ]
    return result


def record(
    series: dict[tuple[int, int], Series],
    in_flight: int,
    batch_size: int,
    stats: RunStats,
    window: CpuWindow,
    counters: dict[str, float],
) -> None:
    series.setdefault((in_flight, batch_size), Series(series_name(in_flight), batch_size)).add(
        stats, window.percent, counters
    )


def table_row(point: Point) -> dict[str, Any]:
    return {
        "system": point.system,
        "batch size": int(point.x),
        "texts/s": point.throughput,
        "p50 ms": point.p50_ms,
        "p99 ms": point.p99_ms,
        "server CPU %": point.extra.get("server_cpu_percent", float("nan")),
        f"{MODEL} batch": point.extra.get("model_batch", float("nan")),
        f"{MODEL} busy %": point.extra.get("model_busy_percent", float("nan")),
        "errors": int(point.extra.get("errors", 0)),
    }
