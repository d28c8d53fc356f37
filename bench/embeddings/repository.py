"""The exported model repository the embeddings systems run: that it is there, and which checkpoint it holds."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from export.checkpoint import Checkpoint


def require_export(repository: Path) -> None:
    wanted = [repository / "bge_onnx" / "1" / "model_int8.onnx", repository / "bge_tokenizer" / "1" / "tokenizer.json"]
    missing = [str(path) for path in wanted if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"no exported model: {', '.join(missing)} missing; run `make export` first")


def checkpoint_for(repository: Path, model: str | None) -> Checkpoint:
    """The checkpoint the repository was exported from (`parity.json` names it), as `export` resolves it."""
    from export.checkpoint import resolve_checkpoint

    checkpoint = resolve_checkpoint(model)
    parity = repository / "bge_onnx" / "1" / "parity.json"
    if parity.is_file():
        exported = json.loads(parity.read_text())
        if exported.get("revision") not in (None, checkpoint.revision):
            raise RuntimeError(
                f"{repository} holds {exported.get('model')} revision {exported.get('revision')}, not "
                f"{checkpoint.name} revision {checkpoint.revision}: pass --model with the exported checkpoint, "
                "or run `make export MODEL=...` again"
            )
    return checkpoint


def max_sequence_length(repository: Path) -> int:
    parity = repository / "bge_onnx" / "1" / "parity.json"
    if parity.is_file():
        return int(json.loads(parity.read_text()).get("max_sequence_length", 512))
    return 512


def model_module(repository: Path, model: str, module: str) -> ModuleType:
    """A python-backend model's own module (e.g. `bge_onnx`'s `encoder`), loaded from the repository, so that
    an in-process system runs the very code Triton runs."""
    path = repository / model / "1" / f"{module}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{model}_{module}", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"no module {path}")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded  # dataclasses look their module up there
    spec.loader.exec_module(loaded)
    return loaded
