"""Make the FP16 (GPU) and INT8 (CPU) variants from the FP32 graph."""

from __future__ import annotations

import logging
from pathlib import Path

from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.transformers.onnx_model import OnnxModel
from onnxruntime.transformers.optimizer import optimize_model

from export.checkpoint import Checkpoint

log = logging.getLogger(__name__)


def optimize_graph(src: Path, checkpoint: Checkpoint, *, use_gpu: bool) -> OnnxModel:
    """onnxruntime's BERT optimiser: fused attention, embedding/skip layer norms and GELU.

    Only the graph-level fusions run here (opt_level 0); the provider-specific
    ones happen when the serving session loads the graph on its device.
    """
    model = optimize_model(
        str(src),
        model_type="bert",
        num_heads=checkpoint.num_heads,
        hidden_size=checkpoint.hidden_size,
        use_gpu=use_gpu,
        opt_level=0,
    )
    log.info("fused operators: %s", model.get_fused_operator_statistics())
    return model


def to_fp16(src: Path, out: Path, checkpoint: Checkpoint) -> Path:
    """Fused graph in FP16 with FP32 inputs/outputs, for CUDA instances."""
    model = optimize_graph(src, checkpoint, use_gpu=True)
    model.convert_float_to_float16(keep_io_types=True)
    model.save_model_to_file(str(out))
    return out


def quantize_int8(src: Path, out: Path) -> Path:
    """Per-channel INT8 weights in the constant-weight MatMuls, activations quantised at run time.

    onnxruntime's defaults (per-tensor, every op) lose too much of the FP32
    vectors' cosine similarity; per-channel weights in the MatMuls alone keep
    it close while still running much faster than FP32 on the CPU. Fusing the
    graph first was slower: the fused Attention op keeps its QKV projection in
    FP32, and quantising it as QAttention still lost to plain MatMulInteger
    kernels. The parity check holds each export to its tolerance.
    """
    quantize_dynamic(
        str(src),
        str(out),
        per_channel=True,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
        extra_options={"MatMulConstBOnly": True},
    )
    return out
