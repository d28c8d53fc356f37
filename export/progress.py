"""What a long run draws on stderr while it works, on a terminal only: a tqdm bar (count, rate, time left) where
there is something to count, else a step line with its elapsed time. Piped into a log file or CI nothing is drawn,
since a bar's carriage returns garble a log and the log lines already say what happened (the ingest CLI,
gateway/search/ingest.py, draws its bar the same way).

`python -m export` and `python -m bench` both use it. It lives in export because bench already imports export
(`bench` installs the `export` extra) while export must import neither gateway nor bench code.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import TextIO

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

# A terminal's bar is redrawn this often, so that its elapsed time (and time left) moves during a step that counts
# nothing or a unit that takes minutes. A redraw formats one line: nothing a measured loop would notice.
REDRAW_S = 1.0
STEP_FORMAT = "{desc}: {elapsed}"


@contextmanager
def progress(desc: str, total: int | None, *, unit: str = "it", stream: TextIO | None = None) -> Iterator[tqdm]:
    """A bar over `total` units, or with `total` None a step line (`desc: 00:07`), on `stream` (stderr); it is
    left on the screen when the block ends. While it is drawn, log records bound for the console are printed
    above it rather than through it. Yields the tqdm bar (`update`, `set_postfix_str`); a disabled one off a
    terminal."""
    with ExitStack() as stack:
        bar = stack.enter_context(
            tqdm(
                total=total,
                desc=desc,
                unit=unit,
                file=stream or sys.stderr,
                disable=None,  # off when the stream is not a TTY
                smoothing=0,  # the time left from the average rate: units of a run differ too much for a recent one
                bar_format=STEP_FORMAT if total is None else None,
                dynamic_ncols=True,
            )
        )
        if not bar.disable:
            stack.enter_context(logging_redirect_tqdm(console_loggers()))
            stack.enter_context(redrawn(bar))
        yield bar


def step(desc: str, *, stream: TextIO | None = None) -> AbstractContextManager[tqdm]:
    """A step with nothing to count: `desc: <elapsed>` on a terminal (see `progress`)."""
    return progress(desc, None, stream=stream)


def console_loggers() -> list[logging.Logger]:
    """The root logger and every library logger (transformers has its own) with a handler that prints to stdout
    or stderr: what `logging_redirect_tqdm` must route around a bar."""
    named = [item for item in logging.root.manager.loggerDict.values() if isinstance(item, logging.Logger)]
    return [logger for logger in [logging.root, *named] if any(map(_is_console, logger.handlers))]


def _is_console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.stderr)


@contextmanager
def redrawn(bar: tqdm) -> Iterator[None]:
    """Redraw `bar` every `REDRAW_S` from a daemon thread until the block ends."""
    stopped = threading.Event()

    def redraw() -> None:
        while not stopped.wait(REDRAW_S):
            bar.refresh()

    thread = threading.Thread(target=redraw, name=f"progress: {bar.desc}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stopped.set()
        thread.join()
