"""Virtual environments of the peers a part compares against (infinity-emb, LiteLLM), one each, so that a
peer's pins never touch the project's own environment."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.paths import ROOT


def venv_python(name: str, requirements: Sequence[str]) -> Path:
    """A virtual environment of its own under .run/bench-venvs (a peer's pins never touch ours)."""
    venv = ROOT / ".run" / "bench-venvs" / name
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    wanted = "\n".join(requirements)
    if not (stamp.exists() and stamp.read_text() == wanted):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements], check=True)
        stamp.write_text(wanted)
    return python
