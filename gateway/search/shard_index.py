"""Builds a Qdrant Edge shard's HNSW index in a child process and swaps the indexed copy in.

qdrant-edge-py 0.9's `EdgeShard.optimize()` holds the GIL for the whole build (tens of seconds at 100,000
documents on two cores), which in the gateway's process would stop the event loop, and with it every request.
So the build runs on a copy, in a process of its own (`python -m gateway.search.shard_index FOLDER`):

1. under the collection's write lock: flush, copy the live shard's folder to a new `shard-<hex>/`; from then on
   every write applied to the live shard is also kept in a list;
2. the child loads the copy, optimizes it (HNSW, payload indexes) and closes it; searches and writes go on;
3. under the write lock again, in a thread: load the copy where it lies, replay the kept writes on it, flush,
   and name it in the file `live` (replaced atomically): from then on it is the collection's shard;
4. the store points new reads at it; the old shard is closed once the reads still using it have finished
   (`ShardReaders`), and its folder removed.

Searches wait for none of it: until step 4 they read the old shard, then the new one. The copy is opened at its
final path (an open shard keeps the path it was opened at for the files it creates later), so it is loaded once.
A crash at any step leaves `live` naming a complete shard (no file: `shard/`, the first one); `recover()`
removes the other folders when the collection is opened again.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from qdrant_edge import EdgeShard, UpdateOperation

from gateway.search.durable import write_durably

log = logging.getLogger(__name__)
LIVE = "shard"  # a collection's first shard; later ones are `shard-<hex>`, named in POINTER
POINTER = "live"
# Unindexed points worth a build: below this an exact scan of them costs less than a copy and a swap.
MIN_UNINDEXED_POINTS = 10_000


class ShardReaders:
    """The reads in flight on each open shard, so that a shard taken out of service (swapped out or deleted) is
    closed only after the last read using it; new reads go to its successor meanwhile and wait for nothing."""

    def __init__(self) -> None:
        self._reading: Counter[int] = Counter()
        self._changed = asyncio.Condition()

    @asynccontextmanager
    async def reading(self, shard: EdgeShard) -> AsyncIterator[EdgeShard]:
        key = id(shard)
        self._reading[key] += 1
        try:
            yield shard
        finally:
            self._reading[key] -= 1
            if not self._reading[key]:
                del self._reading[key]
                async with self._changed:
                    self._changed.notify_all()

    async def finished(self, shard: EdgeShard) -> None:
        """Until no read uses `shard` (the caller has already taken it out of service)."""
        async with self._changed:
            await self._changed.wait_for(lambda: id(shard) not in self._reading)


def live_folder(folder: Path) -> Path:
    pointer = folder / POINTER
    return folder / (pointer.read_text().strip() if pointer.is_file() else LIVE)


def needs_index(shard: EdgeShard, min_unindexed: int = MIN_UNINDEXED_POINTS) -> bool:
    info = shard.info()
    return int(info.points_count) - int(info.indexed_vectors_count) >= min_unindexed


def copy_for_indexing(folder: Path, shard: EdgeShard) -> Path:
    """A copy of the live shard to index, in a new folder."""
    shard.flush()
    copy = folder / f"{LIVE}-{uuid.uuid4().hex[:12]}"
    shutil.copytree(live_folder(folder), copy)
    return copy


async def build_index(copy: Path) -> bool:
    """Run the child on `copy`; True when it built an index. Cancelling kills the child."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.search.shard_index", str(copy),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await process.communicate()
    except asyncio.CancelledError:
        process.kill()
        await process.wait()
        raise
    if process.returncode != 0:
        log.warning("indexing %s failed (exit %s): %s", copy, process.returncode, err.decode(errors="replace")[-500:])
        return False
    return out.strip() == b"optimized"


def load_indexed(copy: Path, writes: list[UpdateOperation]) -> tuple[EdgeShard, Path]:
    """The indexed copy, opened, with `writes` replayed on it and named live; and the folder it replaces."""
    folder = copy.parent
    replaced = live_folder(folder)
    indexed = EdgeShard.load(str(copy))
    try:
        for operation in writes:
            indexed.update(operation)
        indexed.flush()
        write_durably(folder / POINTER, copy.name.encode())
    except BaseException:
        indexed.close()
        raise
    return indexed, replaced


def retire(shard: EdgeShard, folder: Path) -> None:
    """Close a swapped-out shard (no read uses it any more) and remove its folder."""
    shard.close()
    shutil.rmtree(folder, ignore_errors=True)


def discard(copy: Path) -> None:
    shutil.rmtree(copy, ignore_errors=True)


def recover(folder: Path) -> None:
    """Remove the shard folders that are not live: copies of builds or swaps cut short (module docstring)."""
    live = live_folder(folder)
    for path in folder.iterdir():
        if path.is_dir() and path.name.startswith(LIVE) and path != live:
            shutil.rmtree(path, ignore_errors=True)


def main(path: str) -> int:
    shard = EdgeShard.load(path)
    optimized = shard.optimize()
    shard.close()
    print("optimized" if optimized else "unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
