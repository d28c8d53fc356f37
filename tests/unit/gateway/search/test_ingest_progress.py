"""What `python -m gateway.search.ingest` shows while it runs: a tqdm bar on a terminal, starting at what earlier
runs had acknowledged; plain lines (no carriage returns, no escape sequences) when piped; nothing when quiet.
The gateway is an httpx mock that acknowledges every batch."""

from __future__ import annotations

import io
import json
import re
from functools import partial
from pathlib import Path

import httpx
import pytest

from gateway.search import ingest as ingest_module
from gateway.search.ingest import ingest
from tests.helpers.terminal import Terminal

PLAIN = re.compile(r"(\d+)/150 documents, \d+ documents/s")


@pytest.fixture(autouse=True)
def gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={"object": "list"}))
    monkeypatch.setattr(httpx, "AsyncClient", partial(httpx.AsyncClient, transport=transport))


async def run(tmp_path: Path, stream: io.StringIO, *, quiet: bool = False) -> int:
    """150 documents, with a blank line among the first 20, which an earlier run acknowledged (19 documents)."""
    lines = [json.dumps({"id": f"d{n}", "text": f"document {n}"}) for n in range(150)]
    lines.insert(5, "")
    source = tmp_path / "docs.jsonl"
    source.write_text("\n".join(lines) + "\n")
    (tmp_path / "docs.jsonl.bulk.progress").write_text("0 20\n")
    return await ingest(
        source, "bulk", url="http://gateway", key=None, batch=16, concurrency=3, quiet=quiet, stream=stream
    )


async def test_a_piped_run_prints_plain_lines_now_and_then_and_no_bar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ingest_module, "PLAIN_EVERY_S", 0.0)  # a line for every batch
    stream = io.StringIO()
    assert await run(tmp_path, stream) == 131
    output = stream.getvalue()
    assert "\r" not in output and "\x1b" not in output, repr(output)
    lines = output.splitlines()
    assert all(PLAIN.fullmatch(line) for line in lines), lines
    counts = [int(PLAIN.fullmatch(line).group(1)) for line in lines]  # type: ignore[union-attr]
    assert counts == sorted(counts) and counts[0] > 19 and counts[-1] == 150, counts
    assert len(lines) == -(-131 // 16)  # one per batch, none repeated at the end


async def test_a_quick_piped_run_prints_only_where_it_ended(tmp_path: Path) -> None:
    stream = io.StringIO()
    await run(tmp_path, stream)  # well under PLAIN_EVERY_S
    assert PLAIN.fullmatch(stream.getvalue().removesuffix("\n")), repr(stream.getvalue())


async def test_on_a_terminal_the_bar_starts_at_the_acknowledged_count_and_reaches_the_total(tmp_path: Path) -> None:
    stream = Terminal()
    assert await run(tmp_path, stream) == 131
    frames = [frame for frame in stream.getvalue().split("\r") if frame.strip()]
    assert len(frames) >= 2, frames
    assert re.search(r"\| 19/150 \[00:00<\?, \? documents/s\]", frames[0]), frames[0]
    assert re.search(r"100%\|.*\| 150/150 \[\d\d:\d\d<00:00, +[\d.]+ documents/s\]\n$", frames[-1]), frames[-1]
    assert not PLAIN.search(stream.getvalue())


@pytest.mark.parametrize("stream", [Terminal, io.StringIO], ids=["terminal", "piped"])
async def test_quiet_prints_nothing(tmp_path: Path, stream: type[io.StringIO]) -> None:
    shown = stream()
    assert await run(tmp_path, shown, quiet=True) == 131
    assert shown.getvalue() == ""
