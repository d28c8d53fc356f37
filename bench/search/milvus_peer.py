"""The search part's Milvus runs: the same documents and queries through the gateway on real Milvus standalone
(`SEARCH_MILVUS_URI`; the `milvus` package's 2.3.5 server), beside the embedded store's figures of the same run.

Two gateways on one Milvus, one after the other, each on a fresh collection:
1. `no flush` (`SEARCH_MILVUS_FLUSH_AFTER_ROWS=0`): the ingested documents stay in growing segments, searched
   through Milvus's interim index, as they were before the gateway flushed bulk writes;
2. the defaults: the ingest is flushed once its writes go quiet, and the figures are taken once Milvus reports
   every row indexed (HNSW), as a user searching a minute after the ingest gets them.
Each: the real documents through the ingest CLI's code, every labelled query through the API against exact search
over the vectors Milvus holds (read back from it), then the latency points (concurrency 1 and 8, with and without
the filter) with the gateway's means of where the time went.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pymilvus import MilvusClient

from bench.milvus_standalone import milvus_answers, milvus_index_progress, milvus_launch
from bench.processes import ServerProcess
from bench.search import api
from bench.search.plan import COLLECTION, MILVUS, MILVUS_NO_FLUSH, Plan
from bench.search.quality import Vectors, unit
from bench.search.report import Measured, record_quality
from bench.search.sweep import sweep
from bench.stack import gateway
from gateway.search.milvus_rows import ids_expression, milvus_name

log = logging.getLogger("bench.search")

CONCURRENCIES = (1, 8)
INDEX_TIMEOUT_SECONDS = 300.0
READ_BATCH = 1_000


async def run_milvus(
    plan: Plan, log_dir: Path, environment: dict[str, str], measured: Measured, queries: Vectors, triton: ServerProcess
) -> list[str]:
    """Both Milvus runs into `measured` (quality under "real documents: <system>", latency per system); answers
    the report's notes. `environment` is the embedded run's gateway environment (the running `triton`, caches
    off)."""
    shutil.rmtree(log_dir / "milvus", ignore_errors=True)  # a fresh Milvus: no collection of an earlier run
    launch = milvus_launch(log_dir / "milvus")
    milvus = ServerProcess("milvus", launch.command, env=launch.env, log_dir=log_dir)
    milvus.start(lambda: milvus_answers(launch.uri), timeout=300)
    notes = []
    try:
        # The gateway's default (1,000 rows) flushes the real documents; `--quick`'s few hundred need a lower one.
        flushing = str(min(1000, len(plan.corpus.documents)))
        for system, flush_rows in ((MILVUS_NO_FLUSH, "0"), (MILVUS, flushing)):
            settings = {**environment, "SEARCH_MILVUS_URI": launch.uri, "SEARCH_MILVUS_FLUSH_AFTER_ROWS": flush_rows}
            settings.pop("SEARCH_PATH", None)
            endpoint = gateway(log_dir, settings, f"gateway-{'milvus' if system == MILVUS else 'milvus-no-flush'}")
            endpoint.server.start(endpoint.ready_url)
            try:
                await api.create_collection(endpoint.base_url)
                rate = await api.ingest(endpoint.base_url, plan)
                waited = await indexed(launch.uri, len(plan.corpus.documents)) if system == MILVUS else None
                ranked = await api.answer_queries(endpoint.base_url, plan.corpus.queries, len(plan.corpus.documents))
                ids = [plan.corpus.document_id(i) for i in range(len(plan.corpus.documents))]
                stored = await asyncio.to_thread(milvus_vectors, launch.uri, ids)
                record_quality(measured, "real documents", ranked, stored, queries, plan.corpus.answers, system=system,
                               reference=f"exact on {system}'s vectors")  # fmt: skip
                serving = {"triton": triton, "gateway": endpoint.server, "milvus": milvus}
                await sweep(measured, endpoint.base_url, plan, system, CONCURRENCIES, store_operation="search",
                            serving=serving)  # fmt: skip
                notes.append(
                    f"{system}: ingest {rate:.0f} documents/s"
                    + (f", every row indexed {waited:.0f} s after the ingest returned" if waited is not None else "")
                )
                await api.delete_collection(endpoint.base_url)
            finally:
                endpoint.server.stop()
    finally:
        milvus.stop()
    return notes


async def indexed(uri: str, rows: int) -> float:
    """Seconds until Milvus reports `rows` rows of the collection indexed."""
    started = time.monotonic()
    while time.monotonic() - started < INDEX_TIMEOUT_SECONDS:
        progress = await asyncio.to_thread(milvus_index_progress, uri, COLLECTION)
        if progress is not None and progress[0] >= rows:
            return time.monotonic() - started
        await asyncio.sleep(1.0)
    raise RuntimeError(f"Milvus had not indexed {rows} rows after {INDEX_TIMEOUT_SECONDS:.0f} s")


def milvus_vectors(uri: str, ids: Sequence[str]) -> Vectors:
    """The vectors Milvus holds for `ids`: the exact search's reference must use the very vectors it searched."""
    client = MilvusClient(uri=uri, timeout=30)
    try:
        found: dict[str, list[float]] = {}
        for at in range(0, len(ids), READ_BATCH):
            rows = client.query(
                milvus_name(COLLECTION),
                filter=ids_expression(list(ids[at : at + READ_BATCH])),
                output_fields=["id", "vector"],
                consistency_level="Strong",
            )
            found.update((row["id"], row["vector"]) for row in rows)
    finally:
        client.close()
    return unit(np.asarray([found[i] for i in ids], dtype=np.float32))
