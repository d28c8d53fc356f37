"""What the simulators share: the app that carries one simulator's state, and the command line that serves it.

`python -m simulators.hunyuan` and `python -m simulators.pika` take the same server options (`--host`, `--port`,
`--api-key`, `--seed`, `--log-level`) around their own, and run their app on uvicorn until interrupted.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

import uvicorn
from fastapi import FastAPI

from simulators.control import add_control_routes

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


class Simulator(Protocol):
    """What a simulator app publishes on `app.state`: the live config and the stats."""

    @property
    def config(self) -> object: ...

    @property
    def stats(self) -> object: ...


def simulator_app(title: str, simulator: Simulator, lifespan: Lifespan | None = None) -> FastAPI:
    """An app with no API docs; `app.state` holds the `simulator`, its live `config` and its `stats`."""
    app = FastAPI(title=title, openapi_url=None, docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.simulator = simulator
    app.state.config = simulator.config
    app.state.stats = simulator.stats
    return app


@dataclass(frozen=True)
class SimulatorCommand:
    """One simulator's command line: its own options, and how the parsed options make its app."""

    prog: str  # e.g. "python -m simulators.hunyuan"
    description: str | None  # the first line is the --help description
    default_port: int
    add_options: Callable[[argparse.ArgumentParser], None]  # the options only this simulator has
    create_app: Callable[[argparse.Namespace], FastAPI]


def command_parser(command: SimulatorCommand) -> argparse.ArgumentParser:
    description = command.description.splitlines()[0] if command.description else None
    parser = argparse.ArgumentParser(prog=command.prog, description=description)
    add = parser.add_argument
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=command.default_port)
    add("--api-key", default=None, help="the only accepted key (default: accept any)")
    command.add_options(parser)
    add("--seed", type=int, default=0, help="seed of the random failures")
    add("--log-level", default="info")
    add("--control", action="store_true", help="serve /_simulator/stats and /_simulator/config (fault controls)")
    return parser


def serve(command: SimulatorCommand, argv: Sequence[str] | None = None) -> None:
    """Parse the command line (`argv`, default `sys.argv[1:]`) and serve the app until interrupted."""
    args = command_parser(command).parse_args(argv)
    app = command.create_app(args)
    if args.control:
        add_control_routes(app)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
