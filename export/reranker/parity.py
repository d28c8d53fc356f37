"""Compare each exported reranker variant with sentence-transformers' `CrossEncoder.predict` on fixed pairs."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from export.config import Precision
from export.errors import ShapeMismatchError, ToleranceError
from export.parity import UNRUNNABLE_ON_CPU, unrunnable_reason
from export.reranker.backends.reranker_tokenizer.pair_tokenization import PairTokenizer, graph_inputs
from export.reranker.config import LogitTolerance

log = logging.getLogger(__name__)

_LONG_PASSAGE = " ".join(["Rerankers read the query and the passage together, token by token."] * 80)

# Fixed English and Chinese (query, passage) pairs: relevant and unrelated passages for the same queries (the order
# a reranker is judged by), short and long texts, and a passage the tokenizer must truncate at the maximum length.
PARITY_PAIRS: tuple[tuple[str, str], ...] = (
    ("How do I reset my password?", "Open Settings, choose Account and click 'Reset password'."),
    ("How do I reset my password?", "The quick brown fox jumps over the lazy dog."),
    ("How do I reset my password?", "Passwords must be at least twelve characters long."),
    ("What is the capital of France?", "Paris is the capital and largest city of France."),
    ("What is the capital of France?", "Berlin is the capital of Germany."),
    ("What is the capital of France?", "France is famous for its wine and cheese."),
    ("How long does a refund take?", "Refunds reach your card within five to ten business days."),
    ("How long does a refund take?", "Our stores open at nine in the morning."),
    ("python list comprehension", "A list comprehension builds a list from an iterable in one expression."),
    ("python list comprehension", "Snakes of the genus Python live in Africa, Asia and Australia."),
    ("Why is the sky blue?", "Air scatters short blue wavelengths of sunlight more than long red ones."),
    ("Why is the sky blue?", _LONG_PASSAGE),
    ("如何重置我的密码？", "打开设置，选择账户，然后点击“重置密码”。"),
    ("如何重置我的密码？", "今天天气很好，我们去公园散步吧。"),
    ("中国的首都是哪里？", "北京是中华人民共和国的首都。"),
    ("中国的首都是哪里？", "上海是中国最大的经济中心。"),
    ("退款需要多长时间？", "退款将在五到十个工作日内退回您的银行卡。"),
    ("退款需要多长时间？", "这款手机的电池续航时间很长。"),
    ("深度学习", "深度学习模型在图像识别任务中取得了显著的进步。"),
    ("深度学习", "英雄联盟什么英雄最好"),
    ("什么是语义搜索？", "Semantic search ranks documents by the meaning of a query, not by shared keywords."),
    ("What is semantic search?", "语义搜索根据查询的含义而不是关键词来排序文档。"),
    ("混合 mixed 语言 query", "混合 mixed 语言 text 也应该 work。"),
    ("Numbers 12345 and symbols #@!", "Order #12345 shipped on 2024-05-01 @ 10:00!"),
)


@dataclass
class ScoreParity:
    precision: str
    file: str
    checked: bool
    reason: str = ""
    max_abs_diff: float | None = None
    mean_abs_diff: float | None = None
    spearman: float | None = None
    shape: tuple[int, ...] | None = None
    threshold_max_abs_diff: float | None = None
    threshold_spearman: float | None = None
    passed: bool | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def reference_scores(
    checkpoint_dir: Path, max_length: int, pairs: Sequence[tuple[str, str]]
) -> npt.NDArray[np.float32]:
    """CrossEncoder.predict's raw logits ([pairs, 1]) on the CPU: what the export must reproduce. Its default
    activation for one label, a sigmoid, is switched off, since SCORE is the logit."""
    import torch
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(checkpoint_dir), device="cpu", max_length=max_length)
    scores = model.predict(list(pairs), activation_fn=torch.nn.Identity(), batch_size=16, show_progress_bar=False)
    reference: npt.NDArray[np.float32] = np.asarray(scores, dtype=np.float32).reshape(-1, 1)
    return reference


def onnx_scores(
    model: Path,
    tokenizer: PairTokenizer,
    input_names: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    batch_size: int = 16,
    progress: Callable[[int], object] | None = None,
) -> npt.NDArray[np.float32]:
    """Run `model` on the CPU provider with the tokenization `reranker_tokenizer` runs; `progress` hears how many
    pairs each batch ran."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    chunks: list[npt.NDArray[np.float32]] = []
    for start in range(0, len(pairs), batch_size):
        queries, documents = zip(*pairs[start : start + batch_size], strict=True)
        batch = tokenizer.pack(tokenizer.encode(queries, documents))
        chunks.append(np.asarray(session.run(None, graph_inputs(batch, input_names))[0], dtype=np.float32))
        if progress is not None:
            progress(len(queries))
    return np.concatenate(chunks)


def spearman(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    """Spearman's rank correlation (ties share their mean rank); 0 where either side is constant."""
    ranks = [_mean_ranks(np.asarray(x, dtype=np.float64).ravel()) for x in (a, b)]
    if any(np.ptp(r) == 0 for r in ranks):
        return 0.0  # no order to agree with: a constant scorer ranks nothing
    return float(np.corrcoef(ranks[0], ranks[1])[0, 1])


def _mean_ranks(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    ordered = np.sort(values)
    first = np.searchsorted(ordered, values, side="left")
    last = np.searchsorted(ordered, values, side="right") - 1
    ranks: npt.NDArray[np.float64] = (first + last) / 2.0
    return ranks


def compare(
    precision: Precision,
    model: Path,
    reference: npt.NDArray[np.float32],
    tokenizer: PairTokenizer,
    input_names: Sequence[str],
    tolerance: LogitTolerance,
    progress: Callable[[int], object] | None = None,
) -> ScoreParity:
    """Measure one variant on `PARITY_PAIRS`; an FP16 graph the CPU provider cannot run is recorded as not
    checked (as the embedding export does)."""
    result = ScoreParity(precision.value, model.name, checked=False)
    result.threshold_max_abs_diff, result.threshold_spearman = tolerance.max_abs_diff, tolerance.min_spearman
    try:
        actual = onnx_scores(model, tokenizer, input_names, PARITY_PAIRS, progress=progress)
    except UNRUNNABLE_ON_CPU as exc:
        if precision is not Precision.FP16:
            raise
        result.reason = unrunnable_reason(exc)
        log.warning("%s parity not checked: %s", precision.value, result.reason)
        return result
    result.shape = tuple(actual.shape)
    if actual.shape != reference.shape:
        raise ShapeMismatchError(f"{model.name}: SCORE shape {actual.shape} != reference {reference.shape}")
    differences = np.abs(actual - reference)
    result.checked = True
    result.max_abs_diff = float(differences.max())
    result.mean_abs_diff = float(differences.mean())
    result.spearman = spearman(actual, reference)
    result.passed = result.max_abs_diff <= tolerance.max_abs_diff and result.spearman >= tolerance.min_spearman
    log.info(
        "%s %s shape=%s max_abs_diff=%.2e mean_abs_diff=%.2e spearman=%.6f",
        precision.value,
        model.name,
        result.shape,
        result.max_abs_diff,
        result.mean_abs_diff,
        result.spearman,
    )
    return result


def check_parity(results: list[ScoreParity]) -> None:
    """Raise `ToleranceError` naming every variant outside its bounds."""
    failures = [
        f"{r.precision}: max |logit diff| {r.max_abs_diff:.4g} (needs <= {r.threshold_max_abs_diff}), "
        f"Spearman {r.spearman:.6f} (needs >= {r.threshold_spearman})"
        for r in results
        if r.checked and not r.passed
    ]
    if failures:
        raise ToleranceError("exported reranker disagrees with the CrossEncoder reference: " + "; ".join(failures))
