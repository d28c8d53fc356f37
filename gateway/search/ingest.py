"""Bulk ingestion through the API: `python -m gateway.search.ingest FILE.jsonl --collection NAME`.

Each line of FILE is a document, `{"id": ..., "text": ..., "metadata": {...}}`. Lines go in batches
(`--batch`, 64) to `POST /v1/collections/{name}/documents`, several at once (`--concurrency`), with a progress
line on stderr. A batch the gateway acknowledged is durable, and its line range is appended to a progress file
(FILE.<collection>.progress, fsynced), so a run that was interrupted (or whose gateway was killed) resumes
without sending those lines again. Overload (429), unavailability (503) and connection failures are retried
with back-off; any other refusal stops the run and names the lines.
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
from typing import Any

import httpx
import orjson

RETRIED = {429, 502, 503, 504}
MAX_ATTEMPTS = 8


class IngestError(Exception):
    """The gateway refused a batch (or the file is malformed): the run stops."""


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
    path: Path, collection: str, *, url: str, key: str | None, batch: int, concurrency: int, quiet: bool = False
) -> int:
    """Send every unacknowledged line of `path`; answers how many documents were sent in this run."""
    progress = Progress(path.with_name(f"{path.name}.{collection}.progress"))
    with path.open("rb") as file:
        total = sum(1 for line in file if line.strip()) - len(progress.done)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    queue: asyncio.Queue[Batch | None] = asyncio.Queue(maxsize=concurrency * 2)
    sent = 0
    started = time.monotonic()

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal sent
        while (item := await queue.get()) is not None:
            await send(client, f"{url.rstrip('/')}/v1/collections/{collection}/documents", item)
            progress.acknowledge(item)
            sent += len(item.documents)
            if not quiet:
                rate = sent / max(time.monotonic() - started, 1e-9)
                print(f"\r{sent}/{total} documents, {rate:.0f} documents/s", end="", file=sys.stderr, flush=True)

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
        if not quiet:
            print(file=sys.stderr)
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
