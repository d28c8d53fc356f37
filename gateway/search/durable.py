"""Replacing a small file so that a crash leaves the old content or the new one, never half of either."""

from __future__ import annotations

import os
from pathlib import Path


def write_durably(path: Path, content: bytes) -> None:
    """Write `content` to `path` through a temporary file, fsynced, renamed over it, the folder fsynced."""
    temporary = path.with_suffix(".tmp")
    with temporary.open("wb") as file:
        file.write(content)
        file.flush()
        os.fsync(file.fileno())
    temporary.replace(path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
