"""The command line of every generated document (`python -m gateway.settings_doc`, `gateway.errors_doc`): write the
document, or with `--check` write nothing and fail when the tracked one differs, so it cannot drift from the code."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def generated_doc_main(
    argv: Sequence[str] | None, *, module: str, what: str, document: Path, render: Callable[[], str]
) -> int:
    """`module` is the generator's (for its usage line), `what` the source it reads (for its description)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=f"write {document.name} from {what}")
    parser.add_argument("--check", action="store_true", help="fail if the document differs; write nothing")
    parser.add_argument("--output", type=Path, default=document, help="the document (default: %(default)s)")
    args = parser.parse_args(argv)
    output: Path = args.output
    text = render()
    if args.check:
        current = output.read_text(encoding="utf-8") if output.exists() else None
        if current != text:
            print(f"{output} is out of date: run `python -m {module}`", file=sys.stderr)
            return 1
        return 0
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    print(f"wrote {output}")
    return 0
