"""What the reranker export produces, per architecture: the graph's tensors and each precision's parity bounds."""

from __future__ import annotations

from dataclasses import dataclass, field

from export.checkpoint import Checkpoint
from export.config import Precision, onnx_config_for
from export.errors import UnsupportedModelError


@dataclass(frozen=True)
class LogitTolerance:
    """How far a variant's relevance logits may stray from the PyTorch reference's on the parity pairs.

    `max_abs_diff` is in logit units: clients threshold the raw SCORE (or its sigmoid), so a threshold set on the
    PyTorch model must carry over. `min_spearman` bounds the reordering: a reranker is judged by the order it puts
    documents in, which a small absolute error can still change where two scores lie close together.
    """

    max_abs_diff: float
    min_spearman: float


# FP32 is the same arithmetic as PyTorch up to kernel order (a few 1e-6 logit on the test models): a larger gap or
# any reordering means a wrong graph or a tokenizer that differs from the reference's. FP16 keeps about three
# significant digits through every layer: a few thousandths on the test models, more on a deeper model with larger
# logits, for which 0.05 leaves room. INT8 weights with dynamically quantised activations moved the test models'
# logits by up to 0.15 (over ranges of 3 to 3.5 logits) with a rank correlation of 0.995 or more; half a logit moves a
# sigmoid score by at most 0.125, and 0.97 lets only near-ties swap. A deeper real checkpoint loses more: its
# figures are in parity.json, and one outside these bounds is refused rather than served.
DEFAULT_LOGIT_TOLERANCES: dict[Precision, LogitTolerance] = {
    Precision.FP32: LogitTolerance(max_abs_diff=1e-3, min_spearman=0.999),
    Precision.FP16: LogitTolerance(max_abs_diff=0.05, min_spearman=0.99),
    Precision.INT8: LogitTolerance(max_abs_diff=0.5, min_spearman=0.97),
}

CLASSIFIER_SUFFIX = "ForSequenceClassification"


@dataclass(frozen=True)
class RerankerOnnxConfig:
    """How to export one cross-encoder architecture: (INPUT_IDS, ATTENTION_MASK[, TOKEN_TYPE_IDS]) -> SCORE."""

    model_type: str
    uses_token_type_ids: bool
    position_offset: int = 0
    opset: int = 17
    output: str = "SCORE"
    tolerances: dict[Precision, LogitTolerance] = field(default_factory=lambda: dict(DEFAULT_LOGIT_TOLERANCES))

    @property
    def inputs(self) -> tuple[str, ...]:
        # BERT-style models tell query from passage by token type; XLM-RoBERTa ones have a single type and take none.
        names = ("INPUT_IDS", "ATTENTION_MASK")
        return (*names, "TOKEN_TYPE_IDS") if self.uses_token_type_ids else names

    @property
    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        axes: dict[str, dict[int, str]] = {name: {0: "batch", 1: "sequence"} for name in self.inputs}
        axes[self.output] = {0: "batch"}
        return axes


def reranker_config_for(checkpoint: Checkpoint, architectures: list[str], num_labels: int) -> RerankerOnnxConfig:
    """The export config of a cross-encoder checkpoint; refuse what is not one relevance logit from a supported
    encoder. The encoder's facts (token types, position offset, opset) are the embedding export's."""
    if not any(name.endswith(CLASSIFIER_SUFFIX) for name in architectures):
        raise UnsupportedModelError(
            f"{checkpoint.name} is not a cross-encoder: expected a *{CLASSIFIER_SUFFIX} architecture, "
            f"config.json names {architectures or 'none'}"
        )
    if num_labels != 1:
        raise UnsupportedModelError(
            f"{checkpoint.name} has {num_labels} labels; a reranker scores relevance with exactly 1 logit"
        )
    encoder = onnx_config_for(checkpoint.model_type)
    return RerankerOnnxConfig(
        checkpoint.model_type, encoder.uses_token_type_ids, encoder.position_offset, opset=encoder.opset
    )
