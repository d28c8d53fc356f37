"""`main_export` for a cross-encoder: checkpoint -> ONNX (FP32, FP16, INT8) -> parity with `CrossEncoder.predict`
-> `reranker*` models in the repository.

As the embedding export: everything is built in a staging folder, and the repository changes only after every
checked variant met its bounds, so a failed export leaves the previous reranker (and always the embedding models)
in place.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from export.checkpoint import resolve_checkpoint
from export.config import Precision
from export.errors import CheckpointError
from export.pipeline import DEFAULT_MAX_LENGTH, effective_max_length, library_versions, make_variants, stage_tokenizer
from export.progress import progress, step
from export.reranker.backends.reranker_tokenizer.pair_tokenization import TRUNCATION_STRATEGY, PairTokenizer
from export.reranker.config import LogitTolerance
from export.reranker.graph import export_scorer, read_reranker_config
from export.reranker.parity import PARITY_PAIRS, ScoreParity, check_parity, compare, reference_scores
from export.reranker.repository import ServedReranker, install

log = logging.getLogger(__name__)

DEFAULT_RERANKER = "BAAI/bge-reranker-v2-m3"


def main_export(
    model: str,
    repository: Path,
    *,
    max_length: int = DEFAULT_MAX_LENGTH,
    work_dir: Path | None = None,
    tolerances: dict[Precision, LogitTolerance] | None = None,
) -> dict[str, Any]:
    """Export the cross-encoder `model` (hub id or directory) into `repository`; return the report written next to
    the model files. `tolerances` overrides the parity bounds per precision."""
    started = time.monotonic()
    if not model:
        raise CheckpointError(f"name a cross-encoder checkpoint (a hub id such as {DEFAULT_RERANKER}, or a directory)")
    checkpoint = resolve_checkpoint(model)
    onnx_config = read_reranker_config(checkpoint)
    max_length = effective_max_length(checkpoint, onnx_config, max_length)
    log.info(
        "exporting reranker %s@%s (%s, inputs %s, max %d tokens)",
        checkpoint.name,
        checkpoint.revision,
        checkpoint.model_type,
        ", ".join(onnx_config.inputs),
        max_length,
    )
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="export-reranker-", dir=work_dir) as tmp:
        staging = Path(tmp)
        tokenizer_file = stage_tokenizer(checkpoint, staging)
        files = make_variants(checkpoint, staging, lambda out: export_scorer(checkpoint, onnx_config, out))
        with step(f"CrossEncoder reference on {len(PARITY_PAIRS)} pairs"):
            reference = reference_scores(checkpoint.path, max_length, PARITY_PAIRS)
        tokenizer = PairTokenizer(str(tokenizer_file), max_length)
        limits = {**onnx_config.tolerances, **(tolerances or {})}
        results = compare_variants(files, reference, tokenizer, onnx_config.inputs, limits)
        report = {
            "model": checkpoint.name,
            "revision": checkpoint.revision,
            "model_type": checkpoint.model_type,
            "task": "rerank",
            "inputs": list(onnx_config.inputs),
            "max_sequence_length": max_length,
            "truncation": TRUNCATION_STRATEGY,
            "opset": onnx_config.opset,
            "files": {precision.value: path.name for precision, path in files.items()},
            "parity": {r.precision: r.as_dict() for r in results},
            "parity_pairs": len(PARITY_PAIRS),
            "reference_logits": {"min": float(reference.min()), "max": float(reference.max())},
            "versions": library_versions(),
            "export_seconds": round(time.monotonic() - started, 1),
        }
        report_file = staging / "parity.json"
        report_file.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        check_parity(results)
        served = ServedReranker(checkpoint.name, checkpoint.revision, max_length, onnx_config.inputs)
        install(repository, served, [*files.values(), report_file], tokenizer_file)
    log.info("installed reranker %s into %s in %.0f s", checkpoint.name, repository, time.monotonic() - started)
    return report


def compare_variants(
    files: dict[Precision, Path],
    reference: npt.NDArray[np.float32],
    tokenizer: PairTokenizer,
    input_names: tuple[str, ...],
    limits: dict[Precision, LogitTolerance],
) -> list[ScoreParity]:
    """Each variant against the reference, with a bar over the pairs compared on a terminal."""
    results: list[ScoreParity] = []
    with progress("parity check", len(files) * len(PARITY_PAIRS), unit=" pairs") as bar:
        for done, (precision, path) in enumerate(files.items(), start=1):
            bar.set_postfix_str(precision.value)
            results.append(
                compare(precision, path, reference, tokenizer, input_names, limits[precision], progress=bar.update)
            )
            bar.update(done * len(PARITY_PAIRS) - bar.n)  # a variant the CPU cannot run passes its pairs over
        bar.set_postfix_str("")
    return results
