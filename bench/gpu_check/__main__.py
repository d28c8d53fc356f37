"""`python3 -m bench.gpu_check [--dry-run] [--wheels DIR] [--out DIR] [--budget SECONDS] [--steps a,b]`.

On a lent GPU machine `bench/gpu_check/run.sh` runs it under `timeout`; here `make gpu-check` runs the dry run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench.gpu_check.check import STEPS, main
from bench.gpu_check.plan import DRY_RUN, FULL


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m bench.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="a tiny model, on the CPU where there is no GPU")
    parser.add_argument("--wheels", type=Path, help="the carry folder (part-1/, part-2/, ...) of carry.sh")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ".run/gpu-check/out"))
    parser.add_argument("--work", type=Path, help="scratch folder for graphs and Triton (default: a new temp one)")
    parser.add_argument("--budget", type=float, default=520.0, help="seconds for the whole run (default 520)")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of: {','.join(STEPS)}")
    args = parser.parse_args(argv)
    unknown = set(args.steps.split(",")) - set(STEPS)
    if unknown:
        parser.error(f"unknown steps {sorted(unknown)}; known: {', '.join(STEPS)}")
    return args


def run(argv: list[str] | None = None) -> int:
    args = parse(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    plan = DRY_RUN if args.dry_run else FULL
    try:
        return main(plan, args.out, work, args.wheels, args.budget, tuple(args.steps.split(",")))
    finally:
        if args.work is None:  # the graphs of the full model take 2 GB
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run())
