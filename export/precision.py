"""Make the FP16 (GPU) and INT8 (CPU) variants from the FP32 graph."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.transformers.onnx_model import OnnxModel
from onnxruntime.transformers.optimizer import optimize_model

from export.checkpoint import Checkpoint

log = logging.getLogger(__name__)

# What the INT8 graph's attention mask adds to a padded key's score. The exported mask adds float32's lowest
# value, and the exp of a logit below about -87 underflows, which ONNX Runtime's CPU Softmax computes on a slow
# path (over ten times the cost of a normal element). At -60 a padded key of a moderate score weighs less than
# 1e-26 of its row's largest, below float32's resolution, and its logit stays on the fast path while the row's
# scores spread less than 27. Batches padded as bge_onnx pads them give the same vectors to the bit; where most
# of a batch is padding, the padded rows move the activations' quantisation range a little (docs/benchmarks.md).
MASK_FLOOR = -60.0
LOWEST = float(np.finfo(np.float32).min)  # what the exporter's mask adds


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
    kernels. The attention mask's floor is raised to `MASK_FLOOR`. The parity
    check holds each export to its tolerance.
    """
    # The mask is raised in the FP32 graph handed to the quantiser (it quantises MatMul weights only), so the
    # INT8 graph is written once.
    model = onnx.load(str(src))
    raised = replace_scalar_constants(model, LOWEST, MASK_FLOOR)
    log.info("INT8 attention mask: %d constant(s) raised to %g", raised, MASK_FLOOR)
    quantize_dynamic(
        model,
        str(out),
        per_channel=True,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
        extra_options={"MatMulConstBOnly": True},
    )
    return out


def replace_scalar_constants(model: onnx.ModelProto, old: float, new: float) -> int:
    """Set every scalar float32 constant equal to `old` to `new`, in Constant nodes and initializers (the exported
    attention mask adds such a constant, `LOWEST`, to a padded key's score); returns how many changed."""
    tensors = [*model.graph.initializer]
    tensors += [
        a.t for node in model.graph.node if node.op_type == "Constant" for a in node.attribute if a.name == "value"
    ]
    changed = 0
    for tensor in tensors:
        if tensor.data_type != onnx.TensorProto.FLOAT or int(np.prod(tensor.dims)) != 1:
            continue
        value = numpy_helper.to_array(tensor)
        if value.item() == np.float32(old):
            tensor.CopyFrom(numpy_helper.from_array(np.full_like(value, new), tensor.name))
            changed += 1
    return changed
