"""The SQLite usage store: a request id counts once, and its statements never hold the event loop (a write that
waits for the file's lock waits on the store's own thread)."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import date
from pathlib import Path

from gateway.usage.record import Usage
from gateway.usage.store import SqliteUsageStore, UsageEntry


def entry(request_id: str, prompt_tokens: int = 3, *, team: str = "search", given: bool = True) -> UsageEntry:
    usage = Usage(prompt_tokens=prompt_tokens, cost=0.5)
    return UsageEntry(
        request_id, "2026-12-05", "2026-12", "key_abcd", "sk-…abcd", team, "bge", usage, id_may_repeat=given
    )


async def test_a_request_id_counts_once_and_the_report_reads_the_sums(tmp_path: Path) -> None:
    store = SqliteUsageStore(str(tmp_path / "usage.sqlite3"))
    first = await store.add_many([entry("r1"), entry("r2")])
    again = await store.add_many([entry("r2"), entry("r3", prompt_tokens=4)])
    (row,) = await store.rows(date(2026, 12, 1), date(2026, 12, 31))
    await store.aclose()
    await store.aclose()  # a second close is harmless
    assert (first, again, row.counters["prompt_tokens"]) == ([True, True], [False, True], 10)


async def test_a_write_waiting_for_the_files_lock_leaves_the_event_loop_running(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite3"

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
    assert (ticks, added) == (20, [True])


async def test_a_batch_is_summed_per_row_and_a_row_takes_the_team_of_its_last_record(tmp_path: Path) -> None:
    store = SqliteUsageStore(str(tmp_path / "usage.sqlite3"))
    made = [entry(f"p-{n}", prompt_tokens=n, given=False) for n in range(1, 5)]  # ids this process made
    batch = [
        *made[:2],
        entry("task-1", 10),
        entry("task-1", 10),
        *made[2:3],
        entry("p-4", 4, team="ads", given=False),
    ]
    added = await store.add_many(batch)
    rows = await store.rows(date(2026, 12, 1), date(2026, 12, 31))
    remembered = sqlite3.connect(tmp_path / "usage.sqlite3").execute("SELECT COUNT(*) FROM usage_seen").fetchone()
    await store.aclose()
    assert added == [True, True, True, False, True, True]  # a given id still counts once
    assert [(r.team, r.counters["prompt_tokens"], r.counters["cost"]) for r in rows] == [
        ("ads", 1 + 2 + 10 + 3 + 4, 0.5 * 5)
    ]
    assert remembered[0] == 1  # only the given id is remembered
