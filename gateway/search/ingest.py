"""Bulk ingestion through the API: `python -m gateway.search.ingest FILE.jsonl --collection NAME`.

Each line of FILE is a document, `{"id": ..., "text": ..., "metadata": {...}}`. Lines go in batches
(`--batch`, 64) to `POST /v1/collections/{name}/documents`, several at once (`--concurrency`), with a progress
bar on stderr (plain lines now and then when stderr is not a terminal). A batch the gateway acknowledged is
durable, and its line range is appended to a progress file (FILE.<collection>.progress, fsynced), so a run that
was interrupted (or whose gateway was killed) resumes without sending those lines again. Overload (429),
unavailability (503) and connection failures are retried with back-off; any other refusal stops the run and names
the lines.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx
import orjson
from tqdm import tqdm

RETRIED = {429, 502, 503, 504}
MAX_ATTEMPTS = 8
# A piped run (a log file, CI) gets a plain line at most this often, and one at the end: progress in the log
# without a line per batch (a million documents are 15,000 batches).
PLAIN_EVERY_S = 10.0


class IngestError(Exception):
    """The gateway refused a batch other than for overload or unavailability, did not take it after every
    retry, or a line of the file is not JSON: the run stops, naming the lines.

    Do: fix those lines (or the gateway) and run again: the progress file skips the batches already taken.
    """


@dataclass(frozen=True)
class Batch:
    start: int  # first line number (0-based)
    end: int  # one past the last
    documents: list[Any]


class Progress:
    """Acknowledged line ranges, appended to a file and fsynced, read back on the next run."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: set[int] = set()
        if path.is_file():
            for line in path.read_text().splitlines():
                start, end = (int(part) for part in line.split())
                self.done.update(range(start, end))
        self._file = path.open("a")

    def acknowledge(self, batch: Batch) -> None:
        self._file.write(f"{batch.start} {batch.end}\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


class Display:
    """How far the run is, on `stream`: a tqdm bar (rate, time left) on a terminal; elsewhere plain
    `640/5183 documents, 36 documents/s` lines, since a bar's carriage returns garble a log. Counts include the
    documents acknowledged by earlier runs; the rate is this run's."""

    def __init__(self, stream: TextIO, total: int, acknowledged: int, *, quiet: bool) -> None:
        self.stream, self.total = stream, total
        self.initial = self.done = self.shown = acknowledged
        self.started = self.shown_at = time.monotonic()
        # disable=None: tqdm turns itself off when the stream is not a TTY; the plain lines take over then.
        self.bar = tqdm(total=total, initial=acknowledged, unit=" documents", file=stream, disable=quiet or None)
        self.plain = not quiet and bool(self.bar.disable)

    def advance(self, count: int) -> None:
        self.done += count
        self.bar.update(count)
        if self.plain and time.monotonic() - self.shown_at >= PLAIN_EVERY_S:
            self.line()

    def line(self) -> None:
        rate = (self.done - self.initial) / max(time.monotonic() - self.started, 1e-9)
        print(f"{self.done}/{self.total} documents, {rate:.0f} documents/s", file=self.stream, flush=True)
        self.shown, self.shown_at = self.done, time.monotonic()

    def close(self) -> None:
        self.bar.close()
        if self.plain and self.done != self.shown:  # where the run ended (or stopped), unless just shown
            self.line()


def batches(path: Path, done: set[int], size: int) -> Iterator[Batch]:
    """Runs of consecutive lines not yet acknowledged, at most `size` documents each."""
    start, end = -1, -1
    documents: list[Any] = []
    with path.open("rb") as file:
        for number, line in enumerate(file):
            if number in done:
                if documents:
                    yield Batch(start, end, documents)
                    start, documents = -1, []
                continue
            if not line.strip():
                continue
            try:
                document = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise IngestError(f"{path}:{number + 1}: not JSON: {exc}") from None
            if start < 0:
                start = number
            end = number + 1
            documents.append(document)
            if len(documents) == size:
                yield Batch(start, end, documents)
                start, documents = -1, []
    if documents:
        yield Batch(start, end, documents)


async def send(client: httpx.AsyncClient, url: str, batch: Batch) -> None:
    for attempt in range(MAX_ATTEMPTS):
        try:
            response = await client.post(url, json={"documents": batch.documents})
        except httpx.TransportError:
            response = None
        if response is not None and response.status_code == 200:
            return
        if response is not None and response.status_code not in RETRIED:
            message = response.json().get("error", {}).get("message", response.text)
            raise IngestError(f"lines {batch.start + 1}-{batch.end}: {response.status_code} {message}")
        await asyncio.sleep(min(0.5 * 2**attempt, 10.0))
    raise IngestError(f"lines {batch.start + 1}-{batch.end}: the gateway did not take them after {MAX_ATTEMPTS} tries")


async def ingest(
    path: Path,
    collection: str,
    *,
    url: str,
    key: str | None,
    batch: int,
    concurrency: int,
    quiet: bool = False,
    stream: TextIO | None = None,
) -> int:
    """Send every unacknowledged line of `path`, showing progress on `stream` (stderr) unless `quiet`; answers
    how many documents were sent in this run."""
    progress = Progress(path.with_name(f"{path.name}.{collection}.progress"))
    total = acknowledged = 0
    with path.open("rb") as file:
        for number, line in enumerate(file):
            if line.strip():  # blank lines are not documents, even inside an acknowledged range
                total += 1
                acknowledged += number in progress.done
    display = Display(sys.stderr if stream is None else stream, total, acknowledged, quiet=quiet)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    queue: asyncio.Queue[Batch | None] = asyncio.Queue(maxsize=concurrency * 2)
    sent = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal sent
        while (item := await queue.get()) is not None:
            await send(client, f"{url.rstrip('/')}/v1/collections/{collection}/documents", item)
            progress.acknowledge(item)
            sent += len(item.documents)
            display.advance(len(item.documents))

    async def feed() -> None:
        for item in batches(path, progress.done, batch):
            await queue.put(item)
        for _ in range(concurrency):
            await queue.put(None)

    try:
        async with httpx.AsyncClient(headers=headers, timeout=120) as client:
            tasks = [asyncio.create_task(feed()), *(asyncio.create_task(worker(client)) for _ in range(concurrency))]
            try:
                await asyncio.gather(*tasks)  # the first failure stops the run
            finally:
                for task in tasks:
                    task.cancel()
    finally:
        progress.close()
        display.close()
    return sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.search.ingest", description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path, help="JSON lines: {id, text, metadata?}")
    parser.add_argument("--collection", required=True)
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the gateway")
    parser.add_argument("--key", default=None, help="an API key, when the gateway has GATEWAY_API_KEYS")
    parser.add_argument("--batch", type=int, default=64, help="documents per request (at most 1,000)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    args = parser.parse_args(argv)
    try:
        sent = asyncio.run(
            ingest(
                args.file, args.collection, url=args.url, key=args.key, batch=args.batch, concurrency=args.concurrency
            )
        )
    except IngestError as exc:
        print(f"ingest stopped: {exc}; run it again to resume after the last acknowledged batch", file=sys.stderr)
        return 1
    print(f"{sent} documents sent to {args.collection}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
