"""`python -m simulators.hunyuan`: serve the Hunyuan simulator on uvicorn (`--help` lists the options)."""

from __future__ import annotations

import argparse

from fastapi import FastAPI

from simulators import hunyuan
from simulators.hunyuan.app import create_hunyuan_simulator
from simulators.hunyuan.config import SimulatorConfig
from simulators.serve import SimulatorCommand, serve


def _add_options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--ttft", type=float, default=0.3, help="seconds before the first token (default 0.3)")
    add("--tps", type=float, default=40.0, help="content pieces per second; 0 = unpaced (default 40)")
    add("--qps", type=int, default=20, help="requests per rolling second before 429; 0 = no quota (default 20)")
    add("--max-concurrency", type=int, default=None, help="requests answered at once before 429")
    add("--error-rate", type=float, default=0.0, help="probability of a 500 (default 0)")
    add("--rate-limit-rate", type=float, default=0.0, help="probability of a random 429 (default 0)")
    add("--drop-after", type=int, default=None, help="cut every stream after N chunks, without [DONE]")
    add("--split-utf8", action="store_true", help="split multi-byte characters across two writes")
    add("--finish-reason", default=None, help='override the finish reason, e.g. "length"')


def _app(args: argparse.Namespace) -> FastAPI:
    config = SimulatorConfig(
        api_key=args.api_key,
        ttft_seconds=args.ttft,
        tokens_per_second=args.tps or None,
        qps_quota=args.qps or None,
        max_concurrency=args.max_concurrency,
        error_rate=args.error_rate,
        rate_limit_rate=args.rate_limit_rate,
        seed=args.seed,
        drop_stream_after_chunks=args.drop_after,
        split_utf8=args.split_utf8,
        finish_reason=args.finish_reason,
    )
    return create_hunyuan_simulator(config)


COMMAND = SimulatorCommand("python -m simulators.hunyuan", hunyuan.__doc__, 9100, _add_options, _app)

if __name__ == "__main__":
    serve(COMMAND)
