"""Builds a Qdrant Edge shard's HNSW index in a child process and swaps the indexed copy in.

qdrant-edge-py 0.9's `EdgeShard.optimize()` holds the GIL for the whole build (tens of seconds at 100,000
documents on two cores), which in the gateway's process would stop the event loop, and with it every request.
So the build runs on a copy, in a process of its own (`python -m gateway.search.shard_index FOLDER`):

1. under the collection's write lock: flush, copy `shard/` to `shard.next/`; from then on every write applied
   to the live shard is also kept in a list;
2. the child loads `shard.next/`, optimizes it (HNSW, payload indexes) and closes it; searches and writes go on;
3. under the write lock again: load `shard.next/`, replay the kept writes on it, flush, swap the folders
   (`shard/` -> `shard.old/`, `shard.next/` -> `shard/`), close the old shard. Reads in flight finish first and
   new ones wait for the swap (`SwapGate`), so none meets a closed shard.

A crash at any step leaves `shard/` whole, or (between the two renames) `shard.next/` whole and complete:
`recover()` picks the right one when the collection is opened again.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from qdrant_edge import EdgeShard, UpdateOperation

log = logging.getLogger(__name__)
LIVE, NEXT, OLD = "shard", "shard.next", "shard.old"
# Unindexed points worth a build: below this an exact scan of them costs less than a copy and a swap.
MIN_UNINDEXED_POINTS = 10_000


class SwapGate:
    """Reads of a shard (searches, gets, counts) and the swap or close that ends it: a swap waits for the reads in
    flight and holds new ones back until the new shard is in place, so no read meets a closed shard."""

    def __init__(self) -> None:
        self._readers = 0
        self._closing = False
        self._changed = asyncio.Condition()

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._closing)
            self._readers += 1
        try:
            yield
        finally:
            async with self._changed:
                self._readers -= 1
                self._changed.notify_all()

    @asynccontextmanager
    async def closing(self) -> AsyncIterator[None]:
        async with self._changed:
            self._closing = True
            await self._changed.wait_for(lambda: self._readers == 0)
        try:
            yield
        finally:
            async with self._changed:
                self._closing = False
                self._changed.notify_all()


def needs_index(shard: EdgeShard, min_unindexed: int = MIN_UNINDEXED_POINTS) -> bool:
    info = shard.info()
    return int(info.points_count) - int(info.indexed_vectors_count) >= min_unindexed


def copy_for_indexing(folder: Path, shard: EdgeShard) -> None:
    shard.flush()
    shutil.rmtree(folder / NEXT, ignore_errors=True)
    shutil.copytree(folder / LIVE, folder / NEXT)


async def build_index(folder: Path) -> bool:
    """Run the child on `folder/shard.next`; True when it built an index. Cancelling kills the child."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.search.shard_index", str(folder / NEXT),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await process.communicate()
    except asyncio.CancelledError:
        process.kill()
        await process.wait()
        raise
    if process.returncode != 0:
        log.warning("indexing %s failed (exit %s): %s", folder, process.returncode, err.decode(errors="replace")[-500:])
        return False
    return out.strip() == b"optimized"


def swap_in(folder: Path, live: EdgeShard, writes: list[UpdateOperation]) -> EdgeShard:
    """The indexed copy with `writes` replayed on it, opened at `folder/shard`; `live` is closed.

    The copy is closed before the renames and opened again after them: an open shard keeps the path it was
    opened at for the files it creates later."""
    indexed = EdgeShard.load(str(folder / NEXT))
    for operation in writes:
        indexed.update(operation)
    indexed.close()  # flushes
    live.close()  # the caller holds the shard's SwapGate: no read is using it
    (folder / LIVE).rename(folder / OLD)
    (folder / NEXT).rename(folder / LIVE)
    shutil.rmtree(folder / OLD, ignore_errors=True)
    return EdgeShard.load(str(folder / LIVE))


def discard(folder: Path) -> None:
    shutil.rmtree(folder / NEXT, ignore_errors=True)


def recover(folder: Path) -> None:
    """Make `folder/shard` the complete shard after a crash during a swap (see the module docstring)."""
    if not (folder / LIVE).exists() and (folder / NEXT).exists():
        (folder / NEXT).rename(folder / LIVE)
    shutil.rmtree(folder / NEXT, ignore_errors=True)
    shutil.rmtree(folder / OLD, ignore_errors=True)


def main(path: str) -> int:
    shard = EdgeShard.load(path)
    optimized = shard.optimize()
    shard.close()
    print("optimized" if optimized else "unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
