"""The search part's run: Triton and the gateway (embedded store), then Milvus and chromadb on the same data.

1. Ingest: the real documents through the API in 64-document upserts, alternating run by run with the same texts
   through 32-text /v1/embeddings requests (whose vectors are kept for the exact search).
2. Quality on the real documents: every query through the API against exact cosine search over the same vectors;
   the latency at concurrency 1 and 8 on them alone (beside Milvus's, step 4).
3. The gateway stops; the collection is topped up to `plan.total_documents` through its own store (`fill`), the
   gateway starts again on it: quality once more, then the latency sweep (concurrency 1, 8, 32, with and without a
   filter), with the gateway's histograms saying where the time went.
4. Milvus standalone behind the gateway, on the real documents, without and with the flush of bulk writes
   (`milvus_peer`).
5. chromadb, its embedding function running the served INT8 graph in-process, on the same documents, top-up and
   queries (`chroma`).
6. Quality per search mode on the public sets the data folder holds (BEIR's under `beir/<set>/`, LCQMC's under
   `zh/`), through a fresh Triton and gateway (`retrieval`).
Every query and text is embedded by the model (the embedding cache is off and every request says no-cache).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np

from bench.embeddings.repository import require_export
from bench.processes import ServerProcess, stopped_on_exit
from bench.results import PartResult, load_note
from bench.search import api
from bench.search.chroma import POINT_SECONDS, run_chroma
from bench.search.fill import filler, stored_vectors, write_top_up
from bench.search.milvus_peer import CONCURRENCIES as MILVUS_CONCURRENCIES
from bench.search.milvus_peer import run_milvus
from bench.search.plan import (
    CHROMA,
    CONCURRENCIES,
    DEFAULT_DATA,
    GATEWAY,
    GATEWAY_HYBRID,
    GATEWAY_REAL,
    HYBRID_CONCURRENCIES,
    PART,
    PEERS,
    Plan,
)
from bench.search.quality import overlap, quality
from bench.search.report import Measured, build_result, record_quality
from bench.search.retrieval import evaluate, report_line, served_gateway
from bench.search.retrieval_sets import sets_in
from bench.search.scale import run_scale
from bench.search.sweep import sweep
from bench.stack import REPOSITORY, start_gateway, start_triton

log = logging.getLogger("bench.search")
RETRIEVAL_SETS = ("scifact", "nfcorpus", "lcqmc")  # measured when the data folder holds them


async def run(
    out_dir: Path,
    *,
    runs: int = 3,
    quick: bool = False,
    data: Path = DEFAULT_DATA,
    peers: str = ",".join(PEERS),
    scale: int | None = None,
) -> PartResult:
    """The part; with `scale`, its scale step instead (`scale.py`: the plan's collection against one of `scale`
    documents), a run of its own."""
    load_at_start = os.getloadavg()[0]
    require_export(REPOSITORY)
    chosen = frozenset(p.strip() for p in peers.split(",") if p.strip())
    if chosen - PEERS:
        raise ValueError(f"unknown peer(s) {', '.join(sorted(chosen - PEERS))}; choose from {', '.join(PEERS)}")
    plan = Plan.make(data, runs=runs, quick=quick, peers=chosen)
    if scale is not None:
        return await run_scale(out_dir, plan, scale)
    corpus = plan.corpus
    log_dir = out_dir / "logs" / PART
    store = log_dir / "store"
    shutil.rmtree(store, ignore_errors=True)
    measured = Measured()
    notes = [
        f"Documents: the {len(corpus.documents)} distinct second sentences of the positive pairs of MRPC and LCQMC "
        f"test ({data}); queries: the {len(corpus.queries)} distinct first sentences, each with its pair's "
        f"document as the right answer; every document has a `bucket` 0-9 (the filter asks for one).",
        f"Latency on {len(corpus.documents) + plan.filler_count} documents: the real ones plus {plan.filler_count} "
        f"vectors drawn around them, written through the gateway's EmbeddedStore while it was stopped "
        f"(bench/search/fill.py); {plan.queries_per_point} searches per point and run, medians of {plan.runs} runs.",
    ]

    def write() -> PartResult:
        result = build_result(measured, [*notes, load_note(load_at_start)])
        result.write(out_dir)
        return result

    environment = {"EMBEDDING_CACHE_MB": "0", "SEARCH_PATH": str(store)}
    servers: list[ServerProcess] = []
    with stopped_on_exit(servers):
        triton_endpoint = start_triton(log_dir, servers)
        environment["TRITON_URL"] = triton_endpoint.grpc_target
        first = start_gateway(log_dir, environment, "gateway-search", servers)
        await api.create_collection(first.base_url)
        for number in range(plan.runs):
            _, stats = await api.embed(first.base_url, corpus.documents)
            measured.embed_rates.append(stats.items_per_second)
            measured.ingest_rates.append(await api.ingest(first.base_url, plan))
            log.info("run %d: embeddings %.0f texts/s, ingest %.0f documents/s", number + 1,
                     measured.embed_rates[-1], measured.ingest_rates[-1])  # fmt: skip
        queries, _ = await api.embed(first.base_url, corpus.queries, "query", batch=1, concurrency=1)
        ranked = await api.answer_queries(first.base_url, corpus.queries, len(corpus.documents))
        first.server.stop()
        vectors = stored_vectors(store, [corpus.document_id(i) for i in range(len(corpus.documents))])
        record_quality(measured, "real documents", ranked, vectors, queries, corpus.answers)
        if "milvus" in plan.peers:
            second = start_gateway(log_dir, environment, "gateway-search-real", servers)
            await sweep(measured, second.base_url, plan, GATEWAY_REAL, MILVUS_CONCURRENCIES,
                        serving={"triton": triton_endpoint.server, "gateway": second.server})  # fmt: skip
            second.server.stop()
        write()
        top_up = filler(plan, vectors)
        await write_top_up(store, plan, top_up)
        notes.append(f"Top-up: written in {top_up.write_s:.1f} s, indexed in {top_up.index_s:.1f} s.")
        second = start_gateway(log_dir, environment, "gateway-search-full", servers)
        everything = np.concatenate([vectors, top_up.vectors])
        ranked = await api.answer_queries(second.base_url, corpus.queries, len(corpus.documents))
        record_quality(measured, "topped up", ranked, everything, queries, corpus.answers)
        for number in range(plan.runs):
            serving = {"triton": triton_endpoint.server, "gateway": second.server}
            await sweep(measured, second.base_url, plan, GATEWAY, CONCURRENCIES, number, serving=serving)
            await sweep(measured, second.base_url, plan, GATEWAY_HYBRID, HYBRID_CONCURRENCIES, number,
                        serving=serving, mode="hybrid")  # fmt: skip
            write()
        second.server.stop()
        if "milvus" in plan.peers:
            notes += await run_milvus(plan, log_dir, environment, measured, queries, triton_endpoint.server)
            write()
    if "chromadb" in plan.peers:
        max_length = int(json.loads((REPOSITORY / "bge_onnx/1/parity.json").read_text())["max_sequence_length"])
        peer = await run_chroma(plan, top_up.vectors, top_up.texts, log_dir / "chroma", max_length)
        measured.chroma_ingest = peer.ingest_documents_per_second
        counts = {key: sum(len(run.latencies) for run in runs) for key, runs in peer.points.items()}
        notes.append(
            f"{CHROMA}: the same steps in its own process (bench/search/chroma_peer.py); a latency point starts no "
            f"search after {POINT_SECONDS:.0f} s, searches made per point over all runs: "
            + ", ".join(f"{c}{' filter' if f else ''}: {n}" for (c, f), n in sorted(counts.items()))
        )
        for stage, found, exact in (("real documents", peer.quality_small, peer.exact_small),
                                    ("topped up", peer.quality_full, peer.exact_full)):  # fmt: skip
            measured.quality[f"{stage}: {CHROMA}"] = {
                **quality(found, corpus.answers),
                "top-10 overlap with exact": overlap(found, exact),
            }
            measured.quality[f"{stage}: exact on chromadb's vectors"] = quality(exact, corpus.answers)
        for (concurrency, filtered), stats_list in peer.points.items():
            measured.latency[(CHROMA, concurrency, filtered)] = stats_list
    sets = sets_in(data, RETRIEVAL_SETS)
    if sets:  # quality per mode on the public sets the data folder holds (bench/search/retrieval.py)
        with served_gateway(log_dir, "gateway-retrieval") as base_url:
            for labelled in sets:
                measured.retrieval.append(await evaluate(base_url, labelled))
                notes.append(report_line(measured.retrieval[-1]))
                write()
    return write()
