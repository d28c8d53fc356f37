"""Load a cross-encoder's sequence-classification model and trace its relevance logit to ONNX."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedModel

from export.checkpoint import Checkpoint
from export.errors import CheckpointError
from export.graph import export_onnx, load_weights
from export.reranker.config import RerankerOnnxConfig, reranker_config_for


class RelevanceScorer(torch.nn.Module):
    """(input_ids, attention_mask[, token_type_ids]) -> [batch, 1] raw relevance logits, as `CrossEncoder.predict`
    returns them before its activation (sigmoid by default): the graph keeps the logit so that clients choose."""

    def __init__(self, classifier: PreTrainedModel) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        logits: torch.Tensor = self.classifier(input_ids=input_ids, attention_mask=attention_mask, **extra).logits
        return logits


def read_reranker_config(checkpoint: Checkpoint) -> RerankerOnnxConfig:
    """The export config for the checkpoint's classification head (see `reranker_config_for`)."""
    try:
        config = AutoConfig.from_pretrained(checkpoint.path)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {checkpoint.path / 'config.json'}: {exc}") from exc
    return reranker_config_for(checkpoint, list(config.architectures or []), int(config.num_labels))


def load_classifier(checkpoint: Checkpoint) -> PreTrainedModel:
    """The encoder with its classification head; no weight may be missing (a fresh head would score noise)."""
    return load_weights(checkpoint, AutoModelForSequenceClassification)


def export_scorer(checkpoint: Checkpoint, config: RerankerOnnxConfig, out: Path) -> Path:
    """The FP32 graph: `RelevanceScorer` traced with `config`'s tensor names, SCORE [batch, 1]."""
    return export_onnx(RelevanceScorer(load_classifier(checkpoint)), config, out, dimension=1)
