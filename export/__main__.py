"""`python -m export`: parse arguments and call `main_export`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from transformers.utils import logging as transformers_logging

from export.errors import ExportError
from export.pipeline import DEFAULT_MAX_LENGTH, main_export


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m export", description=__doc__)
    parser.add_argument(
        "--model",
        default=os.environ.get("MODEL", ""),
        help="hub id or local checkpoint directory; empty: the packaged all-MiniLM-L6-v2",
    )
    parser.add_argument("--repository", type=Path, default=Path("model_repository"), help="Triton model repository")
    parser.add_argument(
        "--max-length", type=int, default=DEFAULT_MAX_LENGTH, help="tokens per text; longer is truncated"
    )
    parser.add_argument(
        "--query-instruction",
        default=os.environ.get("QUERY_INSTRUCTION", ""),
        help="text put before search queries (e.g. BGE's); empty: the checkpoint's sentence-transformers query "
        "prompt, if it has one",
    )
    parser.add_argument("--work-dir", type=Path, default=Path(".run"), help="where variants are staged")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("export").setLevel(logging.INFO)
    if not sys.stderr.isatty():  # as the export's own bars: transformers' and the hub's would garble a log file
        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        report = main_export(
            args.model or None,
            args.repository,
            max_length=args.max_length,
            work_dir=args.work_dir,
            query_instruction=args.query_instruction or None,
        )
    except ExportError as exc:
        print(f"export failed, the served model is unchanged: {exc}", file=sys.stderr)
        return 1
    for precision, parity in report["parity"].items():
        status = (
            f"min {parity['min_cosine']:.5f} mean {parity['mean_cosine']:.5f}" if parity["checked"] else "not checked"
        )
        print(f"{precision}: {parity['file']} {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
