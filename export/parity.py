"""Compare each exported variant with the sentence-transformers reference."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from tokenizers import Tokenizer

from export.config import Precision, Tolerance
from export.errors import ShapeMismatchError, ToleranceError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

# What onnxruntime raises for a graph the CPU provider has no kernels for (the FP16 graph's fused operators, in
# some builds): such a variant is recorded as not checked rather than failing the export.
UNRUNNABLE_ON_CPU: tuple[type[Exception], ...] = (
    ort.capi.onnxruntime_pybind11_state.NotImplemented,
    ort.capi.onnxruntime_pybind11_state.Fail,
)

# Fixed English and Chinese sentences of varied length, with one that the
# tokenizer must truncate at the model's limit.
PARITY_TEXTS: tuple[str, ...] = (
    "How do I reset my password?",
    "The quick brown fox jumps over the lazy dog.",
    "Triton batches requests from many clients into one model execution.",
    "Semantic search ranks documents by the meaning of a query, not by shared keywords.",
    "What is the capital of France?",
    "Paris is the capital and largest city of France.",
    "A short one.",
    "Can I return an item I bought online to a physical store, and how long does the refund take?",
    "I love programming in Python because the code reads like plain English.",
    "Embeddings map sentences to vectors so that similar sentences lie close together.",
    "The weather today is sunny with a light breeze from the west.",
    "Please summarise the attached quarterly report in three bullet points.",
    "如何重置我的密码？",
    "今天天气很好，我们去公园散步吧。",
    "北京是中华人民共和国的首都。",
    "这款手机的电池续航时间有多长？",
    "语义搜索根据查询的含义而不是关键词来排序文档。",
    "我想了解一下退货流程以及退款需要多长时间。",
    "英雄联盟什么英雄最好",
    "深度学习模型在图像识别任务中取得了显著的进步。",
    "请把这份文件翻译成英文。",
    "混合 mixed 语言 text 也应该 work。",
    "Numbers 12345 and symbols #@! mixed with words.",
    " ".join(["Long documents are truncated at the model's maximum sequence length."] * 60),
)


@dataclass
class VariantParity:
    precision: str
    file: str
    checked: bool
    reason: str = ""
    min_cosine: float | None = None
    mean_cosine: float | None = None
    max_abs_diff: float | None = None
    shape: tuple[int, ...] | None = None
    threshold_min: float | None = None
    threshold_mean: float | None = None
    passed: bool | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def reference_model(checkpoint_dir: Path, max_length: int) -> SentenceTransformer:
    """The sentence-transformers model the export must reproduce, on the CPU."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(checkpoint_dir), device="cpu")
    model.max_seq_length = max_length
    return model


def reference_embeddings(model: SentenceTransformer, texts: tuple[str, ...]) -> npt.NDArray[np.float32]:
    """The sentence-transformers embeddings the export must reproduce (unit norm)."""
    vectors = model.encode(list(texts), batch_size=16, normalize_embeddings=True, show_progress_bar=False)
    reference: npt.NDArray[np.float32] = np.asarray(vectors, dtype=np.float32)
    return reference


def onnx_embeddings(
    model: Path,
    tokenizer: Tokenizer,
    texts: tuple[str, ...],
    batch_size: int = 16,
    progress: Callable[[int], object] | None = None,
) -> npt.NDArray[np.float32]:
    """Run `model` with the tokenizer Triton uses, on the CPU provider; `progress` hears how many texts each
    batch ran."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    chunks: list[npt.NDArray[np.float32]] = []
    for start in range(0, len(texts), batch_size):
        encodings = tokenizer.encode_batch(list(texts[start : start + batch_size]))
        feeds = {
            "INPUT_IDS": np.array([e.ids for e in encodings], dtype=np.int64),
            "ATTENTION_MASK": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        }
        chunks.append(np.asarray(session.run(None, feeds)[0], dtype=np.float32))
        if progress is not None:
            progress(len(encodings))
    return np.concatenate(chunks)


def padded_tokenizer(tokenizer_file: Path, max_length: int) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding()
    return tokenizer


def compare(
    precision: Precision,
    model: Path,
    reference: npt.NDArray[np.float32],
    tokenizer: Tokenizer,
    tolerance: Tolerance,
    progress: Callable[[int], object] | None = None,
) -> VariantParity:
    """Measure one variant; a variant the CPU provider cannot run is recorded as not checked. `progress` hears
    how many texts each batch ran."""
    result = VariantParity(precision.value, model.name, checked=False)
    result.threshold_min, result.threshold_mean = tolerance.min_cosine, tolerance.mean_cosine
    try:
        actual = onnx_embeddings(model, tokenizer, PARITY_TEXTS, progress=progress)
    except UNRUNNABLE_ON_CPU as exc:
        if precision is not Precision.FP16:
            raise
        result.reason = unrunnable_reason(exc)
        log.warning("%s parity not checked: %s", precision.value, result.reason)
        return result
    result.shape = tuple(actual.shape)
    if actual.shape != reference.shape:
        raise ShapeMismatchError(f"{model.name}: output shape {actual.shape} != reference {reference.shape}")
    cosines = np.sum(actual * reference, axis=1) / (np.linalg.norm(actual, axis=1) * np.linalg.norm(reference, axis=1))
    result.checked = True
    result.min_cosine = float(cosines.min())
    result.mean_cosine = float(cosines.mean())
    result.max_abs_diff = float(np.abs(actual - reference).max())
    result.passed = result.min_cosine >= tolerance.min_cosine and result.mean_cosine >= tolerance.mean_cosine
    log.info(
        "%s %s shape=%s min_cos=%.6f mean_cos=%.6f max_abs_diff=%.2e",
        precision.value,
        model.name,
        result.shape,
        result.min_cosine,
        result.mean_cosine,
        result.max_abs_diff,
    )
    return result


def unrunnable_reason(exc: Exception) -> str:
    return f"not runnable on the CPU provider here, checked on GPU instances at load: {exc}"[:300]


def check_parity(results: list[VariantParity]) -> None:
    """Raise `ToleranceError` naming every variant below its threshold."""
    failures = [
        f"{r.precision}: min cosine {r.min_cosine:.6f} (needs >= {r.threshold_min}), "
        f"mean {r.mean_cosine:.6f} (needs >= {r.threshold_mean})"
        for r in results
        if r.checked and not r.passed
    ]
    if failures:
        raise ToleranceError("exported model disagrees with the PyTorch reference: " + "; ".join(failures))
