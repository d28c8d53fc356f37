"""Declarative description of what the export produces, per architecture.

Like optimum's `BertOnnxConfig`: the graph's inputs and outputs, its dynamic
axes, the opset, and the parity tolerance of each precision live here; the
pipeline steps only read them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

from export.errors import UnsupportedModelError


class Precision(str, enum.Enum):
    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"


class Pooling(str, enum.Enum):
    CLS = "cls"
    MEAN = "mean"


@dataclass(frozen=True)
class Tolerance:
    """Cosine similarity to the PyTorch reference that every text (min) and the set (mean) must reach."""

    min_cosine: float
    mean_cosine: float


# File names inside `model_repository/bge_onnx/1/`. `model.onnx` is the plain
# FP32 graph: the reference, the CPU FP32 option and TensorRT's input.
MODEL_FILES: dict[Precision, str] = {
    Precision.FP32: "model.onnx",
    Precision.FP16: "model_fp16.onnx",
    Precision.INT8: "model_int8.onnx",
}

DEFAULT_TOLERANCES: dict[Precision, Tolerance] = {
    Precision.FP32: Tolerance(min_cosine=0.9999, mean_cosine=0.9999),
    Precision.FP16: Tolerance(min_cosine=0.999, mean_cosine=0.999),
    Precision.INT8: Tolerance(min_cosine=0.96, mean_cosine=0.99),
}


class GraphSpec(Protocol):
    """What tracing a graph needs from an export config: the embedding's and the reranker's
    (`export.reranker.config.RerankerOnnxConfig`) both fit."""

    @property
    def inputs(self) -> tuple[str, ...]: ...

    @property
    def output(self) -> str: ...

    @property
    def opset(self) -> int: ...

    @property
    def position_offset(self) -> int: ...

    @property
    def dynamic_axes(self) -> dict[str, dict[int, str]]: ...


@dataclass(frozen=True)
class EmbeddingOnnxConfig:
    """How to export one encoder architecture as a sentence-embedding graph."""

    model_type: str
    uses_token_type_ids: bool
    # Positions a tokenizer may not use (RoBERTa-style models start at pad_id + 1).
    position_offset: int = 0
    opset: int = 17
    # The graph's tensors carry the Triton tensor names, so the python-backend
    # and the native onnxruntime configs share one ensemble.
    inputs: tuple[str, ...] = ("INPUT_IDS", "ATTENTION_MASK")
    output: str = "EMBEDDING"
    tolerances: dict[Precision, Tolerance] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))

    @property
    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        axes: dict[str, dict[int, str]] = {name: {0: "batch", 1: "sequence"} for name in self.inputs}
        axes[self.output] = {0: "batch"}
        return axes


ONNX_CONFIGS: dict[str, EmbeddingOnnxConfig] = {
    "bert": EmbeddingOnnxConfig("bert", uses_token_type_ids=True),
    "roberta": EmbeddingOnnxConfig("roberta", uses_token_type_ids=False, position_offset=2),
    "xlm-roberta": EmbeddingOnnxConfig("xlm-roberta", uses_token_type_ids=False, position_offset=2),
}


def onnx_config_for(model_type: str) -> EmbeddingOnnxConfig:
    try:
        return ONNX_CONFIGS[model_type]
    except KeyError:
        supported = ", ".join(sorted(ONNX_CONFIGS))
        raise UnsupportedModelError(f"model_type {model_type!r} has no export config; supported: {supported}") from None
