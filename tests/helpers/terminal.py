"""A terminal for tests of what long runs draw (tqdm draws on a TTY only): a stream that says it is one, and a
fixture that makes a stream stderr with a root log handler printing to it, as `logging.basicConfig` sets up."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def console_fixture(logger: str, log_format: str) -> Any:
    """A fixture yielding `attach(stream)`: `stream` becomes stderr, and `logger`'s INFO records print to it."""

    @pytest.fixture
    def console(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> Iterator[Callable[[io.StringIO], None]]:
        caplog.set_level(logging.INFO, logger=logger)
        handlers: list[logging.Handler] = []

        def attach(stream: io.StringIO) -> None:
            monkeypatch.setattr(sys, "stderr", stream)
            handler = logging.StreamHandler(stream)
            handler.setFormatter(logging.Formatter(log_format))
            logging.root.addHandler(handler)
            handlers.append(handler)

        yield attach
        for handler in handlers:
            logging.root.removeHandler(handler)

    return console
