"""`python -m simulators.pika`: serve the Pika (fal queue) simulator on uvicorn (`--help` lists the options)."""

from __future__ import annotations

import argparse

from fastapi import FastAPI

from simulators import pika
from simulators.pika.app import create_pika_simulator
from simulators.pika.config import PikaSimulatorConfig
from simulators.serve import SimulatorCommand, serve


def _add_options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--job-seconds", type=float, default=5.0, help="seconds a job takes (default 5)")
    add("--failure-rate", type=float, default=0.0)
    add("--callback-loss-rate", type=float, default=0.0)
    add("--callback-delay", type=float, default=0.0)
    add("--duplicate-callbacks", action="store_true")
    add("--out-of-order", action="store_true")


def _app(args: argparse.Namespace) -> FastAPI:
    config = PikaSimulatorConfig(
        api_key=args.api_key,
        job_seconds=args.job_seconds,
        failure_rate=args.failure_rate,
        callback_loss_rate=args.callback_loss_rate,
        callback_delay_seconds=args.callback_delay,
        duplicate_callbacks=args.duplicate_callbacks,
        out_of_order=args.out_of_order,
        seed=args.seed,
    )
    return create_pika_simulator(config)


COMMAND = SimulatorCommand("python -m simulators.pika", pika.__doc__, 9200, _add_options, _app)

if __name__ == "__main__":
    serve(COMMAND)
