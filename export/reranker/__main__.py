"""`python -m export.reranker`: parse arguments and call `main_export` for a cross-encoder reranker.

A module of its own rather than a `--task rerank` flag on `python -m export`: the two take different arguments
(no query instruction here; a checkpoint is required here, while the embedding export defaults to the packaged
MiniLM) and install different models, so one CLI would need rules about which flags go with which task.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from transformers.utils import logging as transformers_logging

from export.errors import ExportError
from export.pipeline import DEFAULT_MAX_LENGTH
from export.reranker.pipeline import DEFAULT_RERANKER, main_export


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m export.reranker", description=__doc__)
    parser.add_argument(
        "--model",
        default=os.environ.get("RERANKER_MODEL") or DEFAULT_RERANKER,
        help=f"cross-encoder hub id or local checkpoint directory (default {DEFAULT_RERANKER})",
    )
    parser.add_argument("--repository", type=Path, default=Path("model_repository"), help="Triton model repository")
    parser.add_argument(
        "--max-length",
        type=int,
        default=DEFAULT_MAX_LENGTH,
        help="tokens per (query, document) pair, special tokens included; longer pairs are truncated, longest "
        "text first",
    )
    parser.add_argument("--work-dir", type=Path, default=Path(".run"), help="where variants are staged")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("export").setLevel(logging.INFO)
    if not sys.stderr.isatty():  # transformers' and the hub's bars would garble a log file
        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        report = main_export(args.model, args.repository, max_length=args.max_length, work_dir=args.work_dir)
    except ExportError as exc:
        print(f"reranker export failed, the served models are unchanged: {exc}", file=sys.stderr)
        return 1
    for precision, parity in report["parity"].items():
        status = (
            f"max |logit diff| {parity['max_abs_diff']:.2e} Spearman {parity['spearman']:.5f}"
            if parity["checked"]
            else "not checked"
        )
        print(f"{precision}: {parity['file']} {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
