"""`main_export`: checkpoint -> ONNX (FP32, FP16, INT8) -> parity check -> model repository.

Everything is built in a staging folder; the served repository changes only
after every checked variant met its tolerance, so a failed export leaves the
previous model in place.
"""

from __future__ import annotations

import json
import logging
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer

from export.checkpoint import Checkpoint, resolve_checkpoint
from export.config import MODEL_FILES, EmbeddingOnnxConfig, GraphSpec, Precision, Tolerance, onnx_config_for
from export.errors import CheckpointError
from export.graph import SentenceEmbedder, export_onnx, load_encoder
from export.parity import (
    PARITY_TEXTS,
    VariantParity,
    check_parity,
    compare,
    padded_tokenizer,
    reference_embeddings,
    reference_model,
)
from export.precision import quantize_int8, to_fp16
from export.progress import progress, step
from export.repository import ServedModel, install

log = logging.getLogger(__name__)

DEFAULT_MAX_LENGTH = 512


def main_export(
    model: str | None,
    repository: Path,
    *,
    max_length: int = DEFAULT_MAX_LENGTH,
    work_dir: Path | None = None,
    tolerances: dict[Precision, Tolerance] | None = None,
    query_instruction: str | None = None,
) -> dict[str, Any]:
    """Export `model` into `repository`; return the report written next to the model files.

    `tolerances` overrides the architecture's parity thresholds per precision. `query_instruction` is what
    search queries get in front (BGE's "Represent this sentence for searching relevant passages: "); None:
    the checkpoint's own sentence-transformers query prompt, if it has one.
    """
    started = time.monotonic()
    checkpoint = resolve_checkpoint(model)
    onnx_config = onnx_config_for(checkpoint.model_type)
    max_length = effective_max_length(checkpoint, onnx_config, max_length)
    instruction = checkpoint.query_instruction if query_instruction is None else query_instruction
    log.info(
        "exporting %s@%s (%s, %s pooling, max %d tokens)",
        checkpoint.name,
        checkpoint.revision,
        checkpoint.model_type,
        checkpoint.pooling.value,
        max_length,
    )
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="export-", dir=work_dir) as tmp:
        staging = Path(tmp)
        tokenizer_file = stage_tokenizer(checkpoint, staging)
        files = build_variants(checkpoint, onnx_config, staging)
        pytorch = reference_model(checkpoint.path, max_length)  # transformers draws its bar while it loads
        with step(f"PyTorch reference on {len(PARITY_TEXTS)} texts"):
            reference = reference_embeddings(pytorch, PARITY_TEXTS)
        tokenizer = padded_tokenizer(tokenizer_file, max_length)
        limits = {**onnx_config.tolerances, **(tolerances or {})}
        results = compare_variants(files, reference, tokenizer, limits)
        report = {
            "model": checkpoint.name,
            "revision": checkpoint.revision,
            "model_type": checkpoint.model_type,
            "pooling": checkpoint.pooling.value,
            "dimension": checkpoint.hidden_size,
            "max_sequence_length": max_length,
            "query_instruction": instruction,
            "opset": onnx_config.opset,
            "files": {precision.value: path.name for precision, path in files.items()},
            "parity": {r.precision: r.as_dict() for r in results},
            "parity_texts": len(PARITY_TEXTS),
            "versions": library_versions(),
            "export_seconds": round(time.monotonic() - started, 1),
        }
        report_file = staging / "parity.json"
        report_file.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        check_parity(results)
        served = ServedModel(
            checkpoint.name, checkpoint.revision, checkpoint.hidden_size, max_length, query_instruction=instruction
        )
        install(repository, served, [*files.values(), report_file], tokenizer_file)
    log.info("installed %s into %s in %.0f s", checkpoint.name, repository, time.monotonic() - started)
    return report


def effective_max_length(checkpoint: Checkpoint, onnx_config: GraphSpec, requested: int) -> int:
    if requested < 2:
        raise ValueError(f"max length must be >= 2 tokens, got {requested}")
    limit = checkpoint.max_position_embeddings - onnx_config.position_offset
    if requested > limit:
        log.warning("max length %d exceeds the model's %d positions; using %d", requested, limit, limit)
    return min(requested, limit)


def stage_tokenizer(checkpoint: Checkpoint, staging: Path) -> Path:
    """Copy (or build, from a slow tokenizer's files) the fast `tokenizer.json` Triton loads."""
    target = staging / "tokenizer.json"
    source = checkpoint.path / "tokenizer.json"
    if source.is_file():
        shutil.copyfile(source, target)
    else:
        from transformers import AutoTokenizer

        try:
            AutoTokenizer.from_pretrained(checkpoint.path, use_fast=True).backend_tokenizer.save(str(target))
        except (OSError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"{checkpoint.path} has no usable fast tokenizer: {exc}") from exc
    try:
        vocab = Tokenizer.from_file(str(target)).get_vocab_size()
    except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
        raise CheckpointError(f"{source} is not a valid tokenizer.json: {exc}") from exc
    if vocab > checkpoint.vocab_size:
        raise CheckpointError(
            f"tokenizer has {vocab} tokens but the model's embedding table only {checkpoint.vocab_size}: "
            "tokenizer and weights come from different checkpoints"
        )
    return target


def build_variants(checkpoint: Checkpoint, onnx_config: EmbeddingOnnxConfig, staging: Path) -> dict[Precision, Path]:
    """The embedding graph's variants (`make_variants`)."""
    embedder = SentenceEmbedder(load_encoder(checkpoint), checkpoint.pooling, onnx_config.uses_token_type_ids)
    return make_variants(
        checkpoint, staging, lambda out: export_onnx(embedder, onnx_config, out, checkpoint.hidden_size)
    )


def make_variants(checkpoint: Checkpoint, staging: Path, export_fp32: Callable[[Path], Path]) -> dict[Precision, Path]:
    """FP32 by `export_fp32` (given the file to write), then FP16 and INT8 from FP32, with a bar over the variants
    on a terminal (where transformers draws its own while the weights load)."""
    fp32 = staging / MODEL_FILES[Precision.FP32]
    makers: dict[Precision, Callable[[Path], Path]] = {
        Precision.FP32: export_fp32,
        Precision.FP16: lambda out: to_fp16(fp32, out, checkpoint),
        Precision.INT8: lambda out: quantize_int8(fp32, out),
    }
    files: dict[Precision, Path] = {}
    with progress("variants", len(makers), unit="variant") as bar:
        for precision, make in makers.items():
            bar.set_postfix_str(f"making {precision.value}")
            files[precision] = make(staging / MODEL_FILES[precision])
            bar.update()
        bar.set_postfix_str("")
    return files


def compare_variants(
    files: dict[Precision, Path],
    reference: npt.NDArray[np.float32],
    tokenizer: Tokenizer,
    limits: dict[Precision, Tolerance],
) -> list[VariantParity]:
    """Each variant against the reference, with a bar over the texts compared on a terminal."""
    results: list[VariantParity] = []
    with progress("parity check", len(files) * len(PARITY_TEXTS), unit=" texts") as bar:
        for done, (precision, path) in enumerate(files.items(), start=1):
            bar.set_postfix_str(precision.value)
            results.append(compare(precision, path, reference, tokenizer, limits[precision], progress=bar.update))
            bar.update(done * len(PARITY_TEXTS) - bar.n)  # a variant the CPU cannot run passes its texts over
        bar.set_postfix_str("")
    return results


def library_versions() -> dict[str, str]:
    """The versions an export report records: what made the graphs and what checked them."""
    import onnx
    import onnxruntime
    import sentence_transformers
    import tokenizers
    import torch
    import transformers

    modules = (torch, transformers, sentence_transformers, onnx, onnxruntime, tokenizers)
    return {"python": platform.python_version(), **{m.__name__: str(m.__version__) for m in modules}}
