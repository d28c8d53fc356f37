"""Errors raised by the export pipeline.

ExportError
├── CheckpointError        the checkpoint is missing, corrupt or inconsistent
├── UnsupportedModelError  no export config for this architecture or pooling
└── ParityError            an exported variant disagrees with the PyTorch reference
    ├── ShapeMismatchError the output shape differs
    └── ToleranceError     a cosine similarity is below its threshold
"""

from __future__ import annotations


class ExportError(Exception):
    """Base class: the export stopped and left the served model untouched."""


class CheckpointError(ExportError):
    pass


class UnsupportedModelError(ExportError):
    pass


class ParityError(ExportError):
    pass


class ShapeMismatchError(ParityError):
    pass


class ToleranceError(ParityError):
    pass
