"""Load the plain modules that sit beside the models' `model.py` (not a package on sys.path)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.helpers.checkout import TRACKED_REPOSITORY


def load_model_module(model: str, module: str) -> ModuleType:
    path = TRACKED_REPOSITORY / model / "1" / f"{module}.py"
    spec = importlib.util.spec_from_file_location(f"{model}_{module}", path)
    assert spec and spec.loader
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded  # dataclasses look their module up there
    spec.loader.exec_module(loaded)
    return loaded
