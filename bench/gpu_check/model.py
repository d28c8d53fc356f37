"""The model the check measures: a randomly initialised BERT of the served checkpoint's shape, CLS-pooled.

No model hub is reachable from a lent machine, so the weights are random, as in the tests' CLS-pooling
checkpoint (tests/conftest.py). The cost of a forward pass depends on the shape alone; parity of FP16 against
FP32 depends on the weights too, and random weights give no outlier activations, so a real checkpoint's parity
can only be as good or worse (the export checks it on the real one: docs/benchmarks.md, "Export parity").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import BertModel

    from export.checkpoint import Checkpoint
    from export.graph import SentenceEmbedder

CLS_ID = 101  # BERT vocabularies put [CLS] here and [SEP] after it (BGE's Chinese one too)
SEP_ID = 102
FIRST_WORD_ID = 1000  # random rows draw their tokens above the special and unused ids


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    heads: int
    intermediate: int
    vocab: int
    max_positions: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# BAAI/bge-large-zh-v1.5: 24 layers, hidden 1024, 16 heads, FFN 4096, BERT's Chinese vocabulary, 512 positions.
BGE_LARGE = ModelShape("random BERT of BAAI/bge-large-zh-v1.5's shape", 24, 1024, 16, 4096, 21128, 512)
# The dry run's: the same vocabulary and positions, so the same code paths, at a cost of milliseconds.
TINY = ModelShape("tiny random BERT (dry run)", 2, 64, 4, 128, 21128, 512)


def random_encoder(shape: ModelShape, seed: int) -> BertModel:
    """The bare encoder (no pooler), in eval mode, with eager attention: the pattern the ONNX export fuses."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        intermediate_size=shape.intermediate,
        max_position_embeddings=shape.max_positions,
    )
    model = BertModel(config, add_pooling_layer=False)
    model.set_attn_implementation("eager")
    model.train(False)
    return model


def cls_embedder(encoder: BertModel) -> SentenceEmbedder:
    """Encoder + CLS pooling + L2 normalisation: the module the export traces (export/graph.py)."""
    from export.config import Pooling
    from export.graph import SentenceEmbedder

    return SentenceEmbedder(encoder, Pooling.CLS, uses_token_type_ids=True).eval()


def checkpoint_for(shape: ModelShape, path: Path, seed: int) -> Checkpoint:
    """What the export's FP16 step reads of a checkpoint (heads and width), for weights never written to disk."""
    from export.checkpoint import Checkpoint
    from export.config import Pooling

    return Checkpoint(
        path=path,
        name=shape.name,
        revision=f"random-seed-{seed}",
        model_type="bert",
        hidden_size=shape.hidden,
        num_heads=shape.heads,
        max_position_embeddings=shape.max_positions,
        vocab_size=shape.vocab,
        pooling=Pooling.CLS,
    )


def token_rows(shape: ModelShape, lengths: list[int], generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random rows of the given lengths ([CLS] ... [SEP]), right-padded to the longest: ids and mask, int64."""
    import torch

    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.randint(FIRST_WORD_ID, shape.vocab, (length,), generator=generator)
        ids[row, 0], ids[row, length - 1] = CLS_ID, SEP_ID
        mask[row, :length] = 1
    return ids, mask


def parity_lengths(shape: ModelShape, rows: int, generator: torch.Generator) -> list[int]:
    """Row lengths spread from 8 tokens to the model's limit, as a mix of short and long texts is."""
    import torch

    low, high = 8, shape.max_positions
    return [int(n) for n in torch.randint(low, high + 1, (rows,), generator=generator)]
