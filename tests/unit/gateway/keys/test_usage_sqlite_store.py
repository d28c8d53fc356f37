"""The SQLite usage store: a request id counts once, and its statements never hold the event loop (a write that
waits for the file's lock waits on the store's own thread)."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import date
from pathlib import Path

from gateway.usage.record import Usage
from gateway.usage.store import SqliteUsageStore, UsageEntry


def entry(request_id: str, prompt_tokens: int = 3) -> UsageEntry:
    usage = Usage(prompt_tokens=prompt_tokens)
    return UsageEntry(request_id, "2026-12-05", "2026-12", "key_abcd", "sk-…abcd", "search", "bge", usage)


def test_a_request_id_counts_once_and_the_report_reads_the_sums(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[bool], list[bool], float]:
        store = SqliteUsageStore(str(tmp_path / "usage.sqlite3"))
        first = await store.add_many([entry("r1"), entry("r2")])
        again = await store.add_many([entry("r2"), entry("r3", prompt_tokens=4)])
        (row,) = await store.rows(date(2026, 12, 1), date(2026, 12, 31))
        await store.aclose()
        await store.aclose()  # a second close is harmless
        return first, again, row.counters["prompt_tokens"]

    assert asyncio.run(scenario()) == ([True, True], [False, True], 10)


def test_a_write_waiting_for_the_files_lock_leaves_the_event_loop_running(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite3"

    async def scenario() -> tuple[int, list[bool]]:
        store = SqliteUsageStore(str(path))
        await store.add_many([entry("warm")])  # the schema exists before another process locks the file
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")  # another process mid-transaction (a backup, a report)
        write = asyncio.create_task(store.add_many([entry("waits")]))
        ticks = 0
        while ticks < 20:  # the loop keeps turning while the write waits for the lock
            await asyncio.sleep(0.01)
            ticks += 1
        assert not write.done()
        holder.execute("COMMIT")
        holder.close()
        added = await write
        await store.aclose()
        return ticks, added

    assert asyncio.run(scenario()) == (20, [True])
