"""`make bench` / `python -m bench [PART ...] [--runs N] [--quick]`: run the parts, then write the report.
`python -m bench soak --minutes N [--out DIR]` is the soak (bench/soak/), a run of its own.
`python -m bench history [--results DIR] [--part NAME] [--last N]` prints every run's figures (bench/history.py).

Results go to bench/results/<UTC timestamp>/ (git-ignored): one `<part>.json` per part, `results.json`,
`report.md` and the plots. A part that fails is recorded with its error and the rounds it finished; the others
still run.
SIGTERM or SIGINT stop the run and every server it started.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.paths import RESULTS
from bench.progress import PartProgress
from bench.report import PARTS, write_report
from bench.results import PartResult, machine
from export.progress import progress as export_progress

log = logging.getLogger("bench")
# A part's module, where it is not bench.<part>.
PART_MODULES = {"search": "bench.search.part"}


async def run_part(
    name: str,
    run_dir: Path,
    *,
    runs: int,
    quick: bool,
    options: dict[str, Any],
    progress: PartProgress | None = None,
) -> None:
    """One part, with the options its `run` takes (`progress` too, if it reports its rounds); its result (or its
    failure, with what the part wrote before it: the embeddings part writes after each round) is written to
    run_dir, and its share of the run's bar is complete."""
    module = importlib.import_module(PART_MODULES.get(name, f"bench.{name}"))
    written = run_dir / f"{name}.json"
    written.unlink(missing_ok=True)  # so that a file found after a failure is this run's
    accepted = inspect.signature(module.run).parameters
    started = time.monotonic()
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    for signal_number in (signal.SIGTERM, signal.SIGINT):  # SIGINT is ignored by default in background jobs
        loop.add_signal_handler(signal_number, task.cancel)  # cancelling unwinds the part, which stops its servers
    try:
        given = {**options, "progress": progress}
        extra = {key: value for key, value in given.items() if key in accepted and value is not None}
        result: PartResult = await module.run(run_dir, runs=runs, quick=quick, **extra)
    except Exception as exc:  # one broken part must not cost the others' numbers
        log.error("part %s failed:\n%s", name, traceback.format_exc())
        result = PartResult.read(written) if written.exists() else PartResult(name, x_label="", throughput_unit="")
        result.notes.append(f"failed: {type(exc).__name__}: {exc}")
    result.notes.append(f"part took {time.monotonic() - started:.0f} s")
    result.write(run_dir)
    if progress is not None:
        progress.finish()


def run_parts(names: Sequence[str], run_dir: Path, *, runs: int, quick: bool, options: dict[str, Any]) -> str | None:
    """Each part in turn under the run's bar (parts times runs, on a terminal); the part a signal stopped, if any."""
    with export_progress("bench", len(names) * runs, unit="run") as bar:
        for number, name in enumerate(names, start=1):
            log.info("part %s (%d of %d)", name, number, len(names))
            bar.set_postfix_str(name)
            share = PartProgress(bar, runs)
            try:
                asyncio.run(run_part(name, run_dir, runs=runs, quick=quick, options=options, progress=share))
            except asyncio.CancelledError:
                return name
        bar.set_postfix_str("")
    return None


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == ["soak"]:  # a run of its own (minutes, its own options), never part of `make bench`
        from bench.soak.part import main as soak

        return soak(arguments[1:])
    if arguments[:1] == ["history"]:  # reads bench/results/, runs nothing
        from bench.history import main as history

        return history(arguments[1:])
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", metavar="PART", help=f"any of {', '.join(PARTS)} (default: all)")
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement; medians are reported")
    parser.add_argument("--quick", action="store_true", help="tiny workloads: checks the harness, not the stack")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default bench/results/<time>)")
    parser.add_argument("--repository", type=Path, help="embeddings, gpu: exported model repository")
    parser.add_argument("--model", help="embeddings: the checkpoint it was exported from (default: packaged MiniLM)")
    parser.add_argument("--no-infinity", dest="infinity", action="store_false", default=None, help="embeddings")
    parser.add_argument("--data", type=Path, help="caches, search: folder with en/mrpc_test.tsv and zh/lcqmc_test.tsv")
    parser.add_argument("--peers", help="search: stores run after the embedded one, of milvus,chromadb (default both)")
    parser.add_argument("--scale", type=int, help="search: instead of its steps, its collection against one of SCALE "
                        "documents (e.g. 1000000; built once, cached under .run/bench-search-scale)")  # fmt: skip
    args = parser.parse_args(argv)
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # readiness polls; a line per request costs client CPU
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    options = {
        "repository": args.repository, "model": args.model, "infinity": args.infinity, "data": args.data,
        "peers": args.peers, "scale": args.scale,
    }  # fmt: skip
    run_dir = args.out or RESULTS / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    run_dir.mkdir(parents=True, exist_ok=True)
    stopped = run_parts(args.parts or PARTS, run_dir, runs=args.runs, quick=args.quick, options=options)
    if stopped is not None:
        print(f"interrupted during {stopped}; its servers are stopped, the parts done so far kept", file=sys.stderr)
        write_report(run_dir, machine())
        return 130
    report = write_report(run_dir, machine())
    print(report.read_text())
    print(f"written: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
