"""What one run measures, and the seconds each step may take: the full check on a lent GPU, or the dry run here.

The full plan's steps add up to 520 s, inside the 540 s that `run.sh` gives the whole run (`timeout 540`), which
leaves a 15-minute lease time to start the machine and carry the wheels. A step that ends early leaves its
seconds to the next; one that would start with less than its minimum left is skipped and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.gpu_check.latency import QUICK, Window
from bench.gpu_check.model import BGE_LARGE, TINY, ModelShape


@dataclass(frozen=True)
class StepTime:
    """At most `seconds` for the step's measurements; skipped when fewer than `minimum` are left."""

    seconds: float
    minimum: float


@dataclass(frozen=True)
class Plan:
    shape: ModelShape
    batches: tuple[int, ...]  # rows per call in the PyTorch and ONNX Runtime sweeps
    lengths: tuple[int, ...]  # tokens per row in those sweeps
    window: Window
    parity_rows: int
    served_batches: tuple[int, ...]  # texts per call through Triton
    in_flight: tuple[int, ...]  # calls kept in flight through Triton
    served_window: Window
    times: dict[str, StepTime]
    dry_run: bool = False


# The bench's texts (bench/workload.py) are 13 to 130 tokens in BGE-zh's vocabulary, 47 at the median and 110 at
# the 90th percentile (bench/gpu_check/vocab.py): rows of 32 and 128 tokens bracket them.
FULL = Plan(
    shape=BGE_LARGE,
    batches=(1, 2, 4, 8, 16, 32, 64, 128),
    lengths=(32, 128),
    window=Window(warmup=3, min_calls=20, min_seconds=1.0, max_seconds=3.0),
    parity_rows=64,
    served_batches=(1, 2, 4, 8, 16, 32, 64, 128),
    in_flight=(1, 4),
    served_window=Window(warmup=2, min_calls=10, min_seconds=1.5, max_seconds=3.5),
    times={
        "nvml": StepTime(10, 2),
        "wheels": StepTime(60, 20),
        "model": StepTime(30, 10),
        "torch": StepTime(100, 30),
        "onnx": StepTime(170, 90),
        "triton": StepTime(150, 60),
    },
)

DRY_RUN = Plan(
    shape=TINY,
    batches=(1, 4),
    lengths=(16,),
    window=QUICK,
    parity_rows=16,
    served_batches=(1, 4),
    in_flight=(1,),
    served_window=QUICK,
    times={name: StepTime(60, 1) for name in ("nvml", "wheels", "model", "torch", "onnx", "triton")},
    dry_run=True,
)
