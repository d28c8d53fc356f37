"""The reranker's parity gate on hand-built ONNX graphs: a faithful one passes, broken ones are refused.

The graphs score a pair by its token count (the attention mask's sum), so the reference is exact and each broken
variant breaks one bound on purpose: reversed order (Spearman), a constant shift (the absolute bound alone), a
flat output (shape). They run on the real onnxruntime with the real pair tokenizer, as the export runs them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from export.checkpoint import Checkpoint
from export.config import Precision
from export.errors import ShapeMismatchError, ToleranceError, UnsupportedModelError
from export.reranker.backends.reranker_tokenizer.pair_tokenization import PairTokenizer
from export.reranker.config import DEFAULT_LOGIT_TOLERANCES, reranker_config_for
from export.reranker.parity import PARITY_PAIRS, check_parity, compare, spearman

INPUTS = ("INPUT_IDS", "ATTENTION_MASK", "TOKEN_TYPE_IDS")
INT8 = DEFAULT_LOGIT_TOLERANCES[Precision.INT8]


def token_count_graph(path: Path, *, scale: float = 1.0, shift: float = 0.0, keepdims: int = 1) -> Path:
    """SCORE = scale x tokens + shift, [batch, 1] (or [batch] with keepdims=0)."""
    nodes = [
        helper.make_node("Cast", ["ATTENTION_MASK"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["mask", "axes"], ["tokens"], keepdims=keepdims),
        helper.make_node("Mul", ["tokens", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "shift"], ["SCORE"]),
    ]
    constants = [
        helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
        helper.make_tensor("scale", TensorProto.FLOAT, [], [scale]),
        helper.make_tensor("shift", TensorProto.FLOAT, [], [shift]),
    ]
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"]) for name in INPUTS]
    output = helper.make_tensor_value_info("SCORE", TensorProto.FLOAT, ["batch", 1] if keepdims else ["batch"])
    graph = helper.make_graph(nodes, "token_count", inputs, [output], initializer=constants)
    # IR version 8 goes with opset 17 (onnx would stamp its newest, which this onnxruntime cannot read).
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


@pytest.fixture
def tokenizer(minilm: Checkpoint) -> PairTokenizer:
    return PairTokenizer(str(minilm.path / "tokenizer.json"), 128)


@pytest.fixture
def reference(tokenizer: PairTokenizer) -> np.ndarray:
    """What a faithful graph scores: each pair's token count, [pairs, 1]."""
    queries, documents = zip(*PARITY_PAIRS, strict=True)
    return tokenizer.pack(tokenizer.encode(queries, documents)).token_count.astype(np.float32)


def test_a_faithful_variant_passes(tmp_path: Path, tokenizer: PairTokenizer, reference: np.ndarray) -> None:
    model = token_count_graph(tmp_path / "model.onnx")
    result = compare(Precision.FP32, model, reference, tokenizer, INPUTS, DEFAULT_LOGIT_TOLERANCES[Precision.FP32])
    assert (result.checked, result.passed, result.max_abs_diff, result.shape) == (True, True, 0.0, (24, 1))
    assert result.spearman == pytest.approx(1.0)
    check_parity([result])


def test_a_variant_that_reverses_the_order_is_refused(
    tmp_path: Path, tokenizer: PairTokenizer, reference: np.ndarray
) -> None:
    model = token_count_graph(tmp_path / "model_int8.onnx", scale=-1.0, shift=2 * float(reference.mean()))
    result = compare(Precision.INT8, model, reference, tokenizer, INPUTS, INT8)
    assert result.passed is False and result.spearman == pytest.approx(-1.0)
    with pytest.raises(ToleranceError, match=r"int8: max \|logit diff\| .* Spearman -1\.000000 \(needs >= 0\.97\)"):
        check_parity([result])


def test_a_shift_that_keeps_the_order_is_refused_on_the_logit_bound(
    tmp_path: Path, tokenizer: PairTokenizer, reference: np.ndarray
) -> None:
    """Same order, every score one logit off: a client's threshold on SCORE would move, so it fails."""
    model = token_count_graph(tmp_path / "model_int8.onnx", shift=1.0)
    result = compare(Precision.INT8, model, reference, tokenizer, INPUTS, INT8)
    assert result.spearman == pytest.approx(1.0) and result.max_abs_diff == pytest.approx(1.0)
    with pytest.raises(ToleranceError, match=r"int8: max \|logit diff\| 1 \(needs <= 0\.5\)"):
        check_parity([result])


def test_a_variant_of_another_shape_is_refused(tmp_path: Path, tokenizer: PairTokenizer, reference: np.ndarray) -> None:
    model = token_count_graph(tmp_path / "model.onnx", keepdims=0)
    with pytest.raises(ShapeMismatchError, match=r"SCORE shape \(24,\) != reference \(24, 1\)"):
        compare(Precision.FP32, model, reference, tokenizer, INPUTS, DEFAULT_LOGIT_TOLERANCES[Precision.FP32])


def test_only_failing_variants_are_named(tmp_path: Path, tokenizer: PairTokenizer, reference: np.ndarray) -> None:
    good = compare(Precision.FP32, token_count_graph(tmp_path / "a.onnx"), reference, tokenizer, INPUTS, INT8)
    bad = compare(Precision.INT8, token_count_graph(tmp_path / "b.onnx", shift=3.0), reference, tokenizer, INPUTS, INT8)
    with pytest.raises(ToleranceError) as error:
        check_parity([good, bad])
    assert "int8:" in str(error.value) and "fp32:" not in str(error.value)


def test_spearman_counts_order_only_and_ties_share_a_rank() -> None:
    scores = np.array([0.1, 0.5, 0.3, 2.0], dtype=np.float32)
    assert spearman(scores, scores * 10 - 4) == pytest.approx(1.0)
    assert spearman(scores, -scores) == pytest.approx(-1.0)
    assert spearman(np.array([1, 1, 2], dtype=np.float32), np.array([0, 0, 5], dtype=np.float32)) == pytest.approx(1.0)
    assert spearman(scores, np.zeros(4, dtype=np.float32)) == 0.0  # a constant scorer ranks nothing


def test_token_types_are_an_input_only_for_bert_style_models(minilm: Checkpoint) -> None:
    bert = reranker_config_for(minilm, ["BertForSequenceClassification"], 1)
    assert bert.inputs == INPUTS and bert.output == "SCORE" and bert.position_offset == 0
    xlmr = reranker_config_for(
        Checkpoint(**{**minilm.__dict__, "model_type": "xlm-roberta"}), ["XLMRobertaForSequenceClassification"], 1
    )
    assert xlmr.inputs == ("INPUT_IDS", "ATTENTION_MASK") and xlmr.position_offset == 2
    assert xlmr.dynamic_axes["SCORE"] == {0: "batch"}


@pytest.mark.parametrize(
    ("architectures", "labels", "message"),
    [
        (["BertModel"], 1, "not a cross-encoder: expected a \\*ForSequenceClassification"),
        ([], 1, "names none"),
        (["BertForSequenceClassification"], 2, "has 2 labels"),
    ],
)
def test_what_is_not_a_one_logit_cross_encoder_is_refused(
    minilm: Checkpoint, architectures: list[str], labels: int, message: str
) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        reranker_config_for(minilm, architectures, labels)


def test_an_unsupported_encoder_is_refused(minilm: Checkpoint) -> None:
    gpt2 = Checkpoint(**{**minilm.__dict__, "model_type": "gpt2"})
    with pytest.raises(UnsupportedModelError, match="'gpt2' has no export config"):
        reranker_config_for(gpt2, ["GPT2ForSequenceClassification"], 1)
