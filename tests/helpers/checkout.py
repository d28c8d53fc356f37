"""Where the checkout is, and copies of its tracked model repository."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRACKED_REPOSITORY = ROOT / "model_repository"


def copy_tracked_repository(dest: Path) -> Path:
    """The tracked configs and model.py files, without generated model files."""
    shutil.copytree(
        TRACKED_REPOSITORY,
        dest,
        # the reranker (if one was exported here) is generated whole: no part of it is tracked
        ignore=shutil.ignore_patterns("*.onnx", "parity.json", "tokenizer.json", "__pycache__", "reranker*"),
    )
    return dest
