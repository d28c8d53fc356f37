"""The peer: infinity-emb in its own virtual environment, on the same checkpoint, with each engine that starts."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.embeddings.plan import INFINITY_PREFIX
from bench.paths import ROOT
from bench.peer_venvs import venv_python
from bench.processes import ServerProcess
from bench.stack import Endpoint
from localtriton.ports import free_port

if TYPE_CHECKING:
    from export.checkpoint import Checkpoint

# infinity-emb 0.0.78 and the pins with which it installs and starts here (Python 3.11, torch 2.13 CPU).
INFINITY_REQUIREMENTS = (
    "infinity-emb[server,torch,optimum]==0.0.78",
    "torch==2.13.0",  # the CPU build on this machine's disk, never a CUDA build from the index
    "transformers==4.48.3",  # infinity imports optimum.bettertransformer, which refuses transformers >= 4.49
    "optimum[onnxruntime]==1.26.1",  # 1.27 imports a torch.onnx private that torch 2.13 dropped; 2.x lacks ORT
    "pyarrow==21.0.0",  # sentence-transformers 3 imports datasets; later pyarrow needs numpy 2, infinity numpy < 2
)
# Engines tried, in order. The ONNX one needs an encoder graph beside the checkpoint (hub repositories
# ship one; the packaged checkpoint does not): `peer_checkpoint` adds one, INT8 as ours.
INFINITY_ENGINES = ("torch", "optimum")


@dataclass
class Peer:
    name: str  # series prefix, e.g. "infinity-emb torch"
    endpoint: Endpoint
    model: str


def start_infinity(engine: str, checkpoint: Checkpoint, log_dir: Path, notes: list[str]) -> Peer | None:
    """infinity-emb v2 with `engine` on the checkpoint, or None (and a note saying why) if it cannot run."""
    try:
        python = venv_python("infinity", INFINITY_REQUIREMENTS)
    except (subprocess.CalledProcessError, OSError) as exc:
        notes.append(f"infinity-emb not run: installing {' '.join(INFINITY_REQUIREMENTS)} failed: {exc}")
        return None
    port = free_port()
    served = "minilm"
    arguments = ["v2", "--port", str(port), "--host", "127.0.0.1", "--served-model-name", served]
    arguments += ["--engine", engine, "--device", "cpu", "--log-level", "warning", "--no-model-warmup"]
    arguments += ["--pooling-method", "mean" if checkpoint.pooling.value == "mean" else "cls"]
    binary = str(python.parent / "infinity_emb")
    if engine == "optimum":
        try:
            model_dir = peer_checkpoint(checkpoint, ROOT / ".run" / "bench-cache" / "infinity-checkpoint")
        except Exception as exc:  # the peer's graph failed to build: report it, run the others
            notes.append(f"infinity-emb {engine} not run: building its ONNX graph failed: {exc}")
            return None
        command = ["env", "-C", str(model_dir), binary, *arguments, "--model-id", "."]
    else:
        command = [binary, *arguments, "--model-id", str(checkpoint.path)]
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(log_dir / f"infinity-{engine}-hf"),  # its optimised graph goes here, not in ~/.cache
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "DO_NOT_TRACK": "1",
    }
    server = ServerProcess(f"infinity-{engine}", command, env=env, log_dir=log_dir)
    base = f"http://127.0.0.1:{port}"
    try:
        server.start(f"{base}/health", timeout=300)
    except RuntimeError as exc:
        notes.append(f"infinity-emb {engine} not run: {exc}")
        return None
    return Peer(f"{INFINITY_PREFIX} {engine}", Endpoint(server, f"{base}/health", base), served)


def peer_checkpoint(checkpoint: Checkpoint, directory: Path) -> Path:
    """The checkpoint's files (linked) plus an INT8 encoder graph (`model_quantized.onnx`, last_hidden_state)
    for infinity's ONNX engine, quantised as ours (`export.precision.quantize_int8`).

    infinity 0.0.78 reads a local graph only from the model folder's top level, named relative to
    the folder, so the server is started inside it with `--model-id .`.
    """
    from export import precision

    # Built again when the checkpoint or our quantising code changes, so that the peer's graph stays as ours.
    recipe = hashlib.sha256(Path(precision.__file__).read_bytes()).hexdigest()[:16]
    marker = directory / ".complete"
    if marker.is_file() and marker.read_text() == f"{checkpoint.revision} {recipe}":
        return directory
    import torch

    from export.graph import load_encoder

    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    for source in checkpoint.path.iterdir():
        if source.suffix != ".onnx" and source.name != "onnx":
            (directory / source.name).symlink_to(source.resolve())

    class Encoder(torch.nn.Module):
        def __init__(self, encoder: torch.nn.Module) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> Any:
            kwargs = {"attention_mask": attention_mask, "token_type_ids": token_type_ids}
            return self.encoder(input_ids=input_ids, **kwargs).last_hidden_state

    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {name: {0: "batch", 1: "sequence"} for name in [*names, "last_hidden_state"]}
    sample = torch.ones((2, 8), dtype=torch.long)
    fp32 = directory.parent / f"{directory.name}-fp32.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Encoder(load_encoder(checkpoint)),
            (sample, sample, sample),
            str(fp32),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=17,
            do_constant_folding=True,
            dynamo=False,
        )
    precision.quantize_int8(fp32, directory / "model_quantized.onnx")
    fp32.unlink()
    marker.write_text(f"{checkpoint.revision} {recipe}")
    return directory
