"""Load the encoder and export it, with pooling and L2 normalisation, to ONNX (the reranker traces its own
module with the same `export_onnx`)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import onnx
import torch
from transformers import AutoModel, PreTrainedModel

from export.checkpoint import Checkpoint
from export.config import GraphSpec, Pooling
from export.errors import CheckpointError


class SentenceEmbedder(torch.nn.Module):
    """Encoder + pooling + L2 normalisation: (input_ids, attention_mask) -> unit vectors."""

    def __init__(self, encoder: PreTrainedModel, pooling: Pooling, uses_token_type_ids: bool) -> None:
        super().__init__()
        self.encoder = encoder
        self.pooling = pooling
        self.uses_token_type_ids = uses_token_type_ids

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        extra = {"token_type_ids": torch.zeros_like(input_ids)} if self.uses_token_type_ids else {}
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        if self.pooling is Pooling.CLS:
            pooled = hidden[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2.0, dim=-1)


def load_encoder(checkpoint: Checkpoint) -> PreTrainedModel:
    """The bare encoder in eval mode; refuse a checkpoint whose weights do not fit its config."""
    # The pooler is left out: the embedding pools itself, and checkpoints without one would report it missing.
    return load_weights(checkpoint, AutoModel, optional_prefixes=("pooler.",), add_pooling_layer=False)


def load_weights(
    checkpoint: Checkpoint, auto_class: Any, *, optional_prefixes: tuple[str, ...] = (), **kwargs: Any
) -> PreTrainedModel:
    """`auto_class` (AutoModel, AutoModelForSequenceClassification, ...) from the checkpoint in eval mode; refuse
    weights that do not fit the config, except missing ones under `optional_prefixes`."""
    try:
        # Eager attention exports the pattern that onnxruntime's optimiser fuses.
        model, info = auto_class.from_pretrained(
            checkpoint.path, attn_implementation="eager", output_loading_info=True, **kwargs
        )
    except Exception as exc:  # safetensors, torch and transformers each raise their own types
        raise CheckpointError(f"cannot load weights from {checkpoint.path}: {exc}") from exc
    missing = [key for key in info.get("missing_keys", []) if not key.startswith(optional_prefixes)]
    if missing or info.get("mismatched_keys"):
        problems = missing[:5] or [str(k) for k in info["mismatched_keys"][:5]]
        raise CheckpointError(
            f"weights in {checkpoint.path} do not match its {checkpoint.model_type} config: {', '.join(problems)}"
        )
    loaded: PreTrainedModel = model.eval()
    return loaded


def export_onnx(module: torch.nn.Module, config: GraphSpec, out: Path, dimension: int) -> Path:
    """Trace `module` (one [batch, sequence] int64 tensor per name in `config.inputs`, one [batch, `dimension`]
    output) to `out` with dynamic batch and sequence axes, then run `onnx.checker`."""
    sample = torch.ones((2, 8), dtype=torch.long)  # ones are valid token, mask and token type ids alike
    with warnings.catch_warnings(), torch.no_grad():
        # The TorchScript exporter warns about its own deprecation and about
        # Python control flow inside transformers; neither changes the graph.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (sample,) * len(config.inputs),
            str(out),
            input_names=list(config.inputs),
            output_names=[config.output],
            dynamic_axes=config.dynamic_axes,
            opset_version=config.opset,
            do_constant_folding=True,
            dynamo=False,
        )
    # The tracer cannot always see that the width is fixed (through normalisation, for one); say it.
    graph = onnx.load(str(out))
    graph.graph.output[0].type.tensor_type.shape.dim[1].dim_value = dimension
    onnx.save(graph, str(out))
    onnx.checker.check_model(str(out), full_check=True)
    return out
