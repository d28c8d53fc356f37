"""Tiny randomly initialised cross-encoders (no reranker weights are reachable offline): BERT-shaped, with the
packaged MiniLM's tokenizer, with weights drawn wider than transformers' default so that the logits spread over a
few units as a trained reranker's do rather than all sitting near 0."""

from __future__ import annotations

import shutil
from pathlib import Path

from export.checkpoint import Checkpoint

INIT_RANGE = 0.3  # logits spread over 3 to 3.5 units (transformers' 0.02 leaves them all within 0.01 of each other)


def bert_cross_encoder(path: Path, minilm: Checkpoint, max_length: int) -> Path:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=minilm.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=max_length,
        num_labels=1,
        initializer_range=INIT_RANGE,
    )
    BertForSequenceClassification(config).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm.path / name, path / name)
    return path
