"""What `python -m export` shows while it runs: on a terminal a bar over the variants, a step line with its elapsed
time and a bar over the texts compared, with the log lines printed above the bars; piped, only the log lines. The
steps are fakes that log what the real ones log; no model is loaded."""

from __future__ import annotations

import io
import logging
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.models import BPE

from export import __main__ as cli
from export import pipeline, progress
from export.config import Precision, Tolerance
from export.parity import PARITY_TEXTS, VariantParity
from tests.helpers.terminal import Terminal, console_fixture

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
TEXTS = len(PARITY_TEXTS)


console = console_fixture("export", LOG_FORMAT)


def fake_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Variants that log a line and write their file; a comparison that counts its texts in two batches, except
    for FP16, which the CPU provider cannot run here."""
    log = logging.getLogger("export.precision")

    def make(name: str) -> Callable[..., Path]:
        def write(*args: Any) -> Path:
            out: Path = args[2] if name == "fp32" else args[1]  # export_onnx(embedder, config, out, dimension)
            out.write_text(name)
            log.info("made %s", name)
            return out

        return write

    def compare(
        precision: Precision, path: Path, reference: Any, tokenizer: Any, tolerance: Tolerance, progress: Any
    ) -> VariantParity:
        if precision is not Precision.FP16:
            progress(16)
            progress(TEXTS - 16)
        logging.getLogger("export.parity").info("%s compared", precision.value)
        return VariantParity(precision.value, path.name, checked=precision is not Precision.FP16)

    monkeypatch.setattr(pipeline, "load_encoder", lambda checkpoint: None)
    monkeypatch.setattr(pipeline, "SentenceEmbedder", lambda *args: None)
    monkeypatch.setattr(pipeline, "export_onnx", make("fp32"))
    monkeypatch.setattr(pipeline, "to_fp16", lambda src, out, checkpoint: make("fp16")(src, out))
    monkeypatch.setattr(pipeline, "quantize_int8", make("int8"))
    monkeypatch.setattr(pipeline, "compare", compare)


def export_steps(tmp_path: Path) -> None:
    checkpoint: Any = SimpleNamespace(name="tiny", pooling=None, hidden_size=8)
    onnx_config: Any = SimpleNamespace(uses_token_type_ids=False)
    files = pipeline.build_variants(checkpoint, onnx_config, tmp_path)
    assert [path.read_text() for path in files.values()] == ["fp32", "fp16", "int8"]
    with progress.step(f"PyTorch reference on {TEXTS} texts"):
        pass
    limits, tokenizer = dict.fromkeys(files, Tolerance(0.9, 0.9)), Tokenizer(BPE())  # the fake compare ignores it
    results = pipeline.compare_variants(files, np.zeros((TEXTS, 8), np.float32), tokenizer, limits)
    assert [result.precision for result in results] == ["fp32", "fp16", "int8"]


LOG_LINES = [
    "INFO export.precision: made fp32",
    "INFO export.precision: made fp16",
    "INFO export.precision: made int8",
    "INFO export.parity: fp32 compared",
    "INFO export.parity: fp16 compared",
    "INFO export.parity: int8 compared",
]


def test_piped_the_export_prints_its_log_lines_and_no_bar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, console: Callable[[io.StringIO], None]
) -> None:
    fake_steps(monkeypatch)
    stream = io.StringIO()
    console(stream)
    export_steps(tmp_path)
    assert stream.getvalue().splitlines() == LOG_LINES, repr(stream.getvalue())


def test_on_a_terminal_bars_count_variants_and_texts_with_the_log_lines_above_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, console: Callable[[io.StringIO], None]
) -> None:
    fake_steps(monkeypatch)
    stream = Terminal()
    console(stream)
    export_steps(tmp_path)
    output = stream.getvalue()
    screen = [line.split("\r")[-1].rstrip() for line in output.split("\n")]  # what stays on each line of the screen
    assert [line for line in screen if line.startswith("INFO")] == LOG_LINES, screen
    assert re.fullmatch(r"variants: 100%\|.*\| 3/3 \[\d\d:\d\d<00:00, +[\d.]+(s/)?variants?(/s)?\]", screen[3])
    assert re.fullmatch(rf"PyTorch reference on {TEXTS} texts: 00:00", screen[4]), screen
    # FP16 is not runnable here: its texts are passed over, and the bar still ends at every variant's texts.
    assert re.fullmatch(rf"parity check: 100%\|.*\| {3 * TEXTS}/{3 * TEXTS} \[.* texts/s\]", screen[-2]), screen
    assert re.search(rf"\| {2 * TEXTS}/{3 * TEXTS} \[.*, int8\]", output)  # where the third began


def test_a_step_line_shows_its_elapsed_time_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "REDRAW_S", 0.01)
    stream = Terminal()
    with progress.step("loading", stream=stream):
        time.sleep(0.1)
    frames = [frame for frame in re.split(r"[\r\n]", stream.getvalue()) if frame]
    assert len(frames) >= 3 and set(frames) == {"loading: 00:00"}, frames  # redrawn with nothing counted


def test_piped_a_bar_draws_nothing_and_leaves_the_console_handlers_alone(
    console: Callable[[io.StringIO], None],
) -> None:
    stream = io.StringIO()
    console(stream)
    before = list(logging.root.handlers)
    with progress.progress("variants", 3, unit="variant") as bar:
        assert bar.disable and logging.root.handlers == before
        bar.update()
        logging.getLogger("export.pipeline").info("a log line")
    assert stream.getvalue() == "INFO export.pipeline: a log line\n"


def test_the_loggers_routed_around_a_bar_are_those_printing_to_the_console(
    console: Callable[[io.StringIO], None], tmp_path: Path
) -> None:
    console(Terminal())
    library = logging.getLogger("tests.export.library")  # as transformers: its own handler on stderr
    library.addHandler(logging.StreamHandler(sys.stderr))
    to_file = logging.getLogger("tests.export.file")
    to_file.addHandler(logging.FileHandler(tmp_path / "log"))
    try:
        loggers = progress.console_loggers()
        assert logging.root in loggers and library in loggers and to_file not in loggers
    finally:
        for logger in (library, to_file):
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
                handler.close()


@pytest.mark.parametrize(("stream", "silenced"), [(Terminal, False), (io.StringIO, True)], ids=["terminal", "piped"])
def test_the_cli_turns_transformers_bars_off_when_piped(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    stream: type[io.StringIO],
    silenced: bool,
) -> None:
    caplog.set_level(logging.WARNING, logger="export")  # restored after the test: main() sets INFO
    monkeypatch.setattr(sys, "stderr", stream())
    calls: list[str] = []
    monkeypatch.setattr(cli, "transformers_logging", SimpleNamespace(disable_progress_bar=lambda: calls.append("off")))
    monkeypatch.setattr(cli, "main_export", lambda *args, **kwargs: {"parity": {}})
    assert cli.main(["--repository", str(tmp_path)]) == 0
    assert calls == (["off"] if silenced else [])
