"""The served graph on the GPU: the export's FP32 and FP16 ONNX graphs of the random checkpoint, and the FP16 graph
on ONNX Runtime's CUDA provider in `bge_onnx`'s own session (its `encoder.py`), for parity against PyTorch's FP32
embeddings and throughput with p50 / p99 at batches of 1 to 128.

The export steps are the project's (`export.graph.export_onnx`, `export.precision.to_fp16`), so what is measured
is what `make export` writes for the GPU instances. The CUDA provider comes with onnxruntime-gpu, which a lent
machine gets from the carried wheels; its CPU build has none, and this step then says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.gpu_check.latency import sweep
from bench.gpu_check.model import ModelShape, checkpoint_for, cls_embedder, token_rows
from bench.gpu_check.plan import Plan
from bench.gpu_check.steps import StepSkipped
from bench.gpu_check.torch_check import ParityRows, fp32_reference, parity_line, parity_summary

if TYPE_CHECKING:
    import onnxruntime as ort
    from transformers import BertModel

REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"
CUDA = "CUDAExecutionProvider"


def export_graphs(encoder: BertModel, shape: ModelShape, work: Path, seed: int) -> dict[str, Path]:
    """`model.onnx` (FP32) and `model_fp16.onnx` in `work`, as the export makes them."""
    from export.config import MODEL_FILES, Precision, onnx_config_for
    from export.graph import export_onnx
    from export.precision import to_fp16

    work.mkdir(parents=True, exist_ok=True)
    fp32 = export_onnx(cls_embedder(encoder), onnx_config_for("bert"), work / MODEL_FILES[Precision.FP32], shape.hidden)
    fp16 = to_fp16(fp32, work / MODEL_FILES[Precision.FP16], checkpoint_for(shape, work, seed))
    return {"fp32": fp32, "fp16": fp16}


def cuda_unavailable() -> str | None:
    """Why ONNX Runtime cannot run on CUDA in this process, or None."""
    import onnxruntime as ort

    if CUDA not in ort.get_available_providers():
        return (
            f"onnxruntime {ort.__version__} has no CUDA provider (a CPU build): carry onnxruntime-gpu "
            "(bench/gpu_check/carry.sh) and pass --wheels"
        )
    return None


def preload_cuda_libraries() -> None:
    """Load the CUDA, cuBLAS and cuDNN libraries the CUDA provider links to from the machine's own wheels.

    onnxruntime-gpu links to them by name; importing torch first loads the copies its wheels carry, and
    `preload_dlls` (onnxruntime 1.21 and later) loads those it finds in site-packages."""
    import onnxruntime as ort
    import torch  # noqa: F401  (loads libcudart, libcublas and libcudnn into the process)

    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        preload()


def served_session(graphs: dict[str, Path], on_gpu: bool) -> ort.InferenceSession:
    """The session `bge_onnx` opens with the parameters the export writes: on a KIND_GPU instance the FP16 graph on
    CUDA (with its memory arena's cap), in the dry run a KIND_CPU one on the FP32 graph; through its own
    `encoder.plan_session` and `create_session`."""
    from bench.embeddings.repository import model_module
    from export.repository import runtime_parameters

    encoder = model_module(REPOSITORY, "bge_onnx", "encoder")
    folder = graphs["fp32"].parent
    plan = encoder.plan_session("GPU" if on_gpu else "CPU", 0, runtime_parameters("fp32"), str(folder / "trt"))
    session: ort.InferenceSession = encoder.create_session(str(folder / plan.model_file), plan)
    if on_gpu and CUDA not in session.get_providers():
        raise StepSkipped(
            f"ONNX Runtime fell back to {session.get_providers()}: the CUDA provider's libraries "
            "(libcudart, libcublas, libcudnn for its CUDA version) did not load; see the log above"
        )
    return session


def runner(session: ort.InferenceSession) -> Callable[[Any, Any], Any]:
    def run(ids: Any, mask: Any) -> Any:
        import torch

        feeds = {"INPUT_IDS": ids.numpy(), "ATTENTION_MASK": mask.numpy()}
        (embeddings,) = session.run(None, feeds)
        return torch.from_numpy(np.asarray(embeddings))

    return run


def timed_call(session: ort.InferenceSession, shape: ModelShape, seed: int) -> Callable[[int, int], Callable[[], None]]:
    """For (batch, tokens): one `session.run` over a full batch (it returns only once the outputs are on the host)."""
    import torch

    def make(batch: int, tokens: int) -> Callable[[], None]:
        generator = torch.Generator().manual_seed(seed + batch * 1000 + tokens)
        ids, mask = (t.numpy() for t in token_rows(shape, [tokens] * batch, generator))
        feeds = {"INPUT_IDS": ids, "ATTENTION_MASK": mask}

        def call() -> None:
            session.run(None, feeds)

        return call

    return make


def run(
    encoder: BertModel,
    plan: Plan,
    rows: ParityRows,
    work: Path,
    deadline: float,
    say: Callable[[str], None],
    seed: int = 0,
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Export, then (on CUDA, or on the CPU in the dry run) parity and the sweep; returns the graphs too."""
    reason = cuda_unavailable()
    if reason is not None and not plan.dry_run:
        raise StepSkipped(reason)
    began = time.monotonic()
    graphs = export_graphs(encoder, plan.shape, work, seed)
    exported = {
        "export_seconds": round(time.monotonic() - began, 1),
        "graph_mib": {name: round(path.stat().st_size / 2**20, 1) for name, path in graphs.items()},
    }
    say(f"onnx: exported FP32 and FP16 graphs in {exported['export_seconds']} s")
    on_gpu = reason is None
    if on_gpu:
        preload_cuda_libraries()
    session = served_session(graphs, on_gpu)
    label = "ONNX Runtime FP16 CUDA" if on_gpu else "ONNX Runtime FP32 CPU (dry run)"
    if rows.reference is None:
        rows.reference = fp32_reference(encoder, rows)
    parity = parity_summary(rows.reference, rows.embed(runner(session)))
    say(parity_line(f"onnx parity {label} vs torch FP32", parity))
    measured = sweep(
        label, timed_call(session, plan.shape, seed), plan.batches, plan.lengths, plan.window, deadline, say
    )
    result = {
        **exported,
        "providers": session.get_providers(),
        "cuda_unavailable": reason,
        "parity_vs_torch_fp32": parity,
        "sweep": measured.as_dict(),
    }
    return result, graphs
