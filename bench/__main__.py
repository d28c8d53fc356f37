"""`make bench` / `python -m bench [PART ...] [--runs N] [--quick]`: run the parts, then write the report.

Results go to bench/results/<UTC timestamp>/ (git-ignored): one `<part>.json` per part, `results.json`,
`report.md` and the plots. A part that fails is recorded with its error; the others still run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import sys
import time
import traceback
from pathlib import Path

from bench.common import RESULTS, PartResult, machine
from bench.report import PARTS, write_report

log = logging.getLogger("bench")


async def run_part(name: str, run_dir: Path, *, runs: int, quick: bool) -> None:
    module = importlib.import_module(f"bench.{name}")
    started = time.monotonic()
    try:
        result: PartResult = await module.run(run_dir, runs=runs, quick=quick)
    except Exception as exc:  # one broken part must not cost the others' numbers
        log.error("part %s failed:\n%s", name, traceback.format_exc())
        result = PartResult(part=name, x_label="", throughput_unit="", notes=[f"failed: {type(exc).__name__}: {exc}"])
    result.notes.append(f"part took {time.monotonic() - started:.0f} s")
    result.write(run_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", metavar="PART", help=f"any of {', '.join(PARTS)} (default: all)")
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement; medians are reported")
    parser.add_argument("--quick", action="store_true", help="tiny workloads: checks the harness, not the stack")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default bench/results/<time>)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    run_dir = args.out or RESULTS / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in args.parts or PARTS:
        log.info("part %s", name)
        asyncio.run(run_part(name, run_dir, runs=args.runs, quick=args.quick))
    report = write_report(run_dir, machine())
    print(report.read_text())
    print(f"written: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
