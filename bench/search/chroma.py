"""The side-by-side peer: chromadb in its own virtual environment, driven through `chroma_peer.py` on the same
documents, top-up vectors and queries as the gateway."""

from __future__ import annotations

import asyncio
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.paths import ROOT
from bench.peer_venvs import venv_python
from bench.run_stats import RunStats
from bench.search.plan import BUCKETS, CONCURRENCIES, INGEST_BATCH, INGEST_CONCURRENCY, TOP_K, Plan
from bench.search.quality import Vectors

# chromadb and the runtime the served graph needs, at the stack's own onnxruntime and numpy.
CHROMA_REQUIREMENTS = ("chromadb==1.5.9", "onnxruntime==1.31.1", "tokenizers==0.23.3", "numpy==1.26.4")
PEER_SCRIPT = Path(__file__).with_name("chroma_peer.py")
# A latency point stops starting searches after this long: chromadb's filtered search takes a tenth of a second
# or more at 100,000 documents, and 1,000 of them at every point would hold the run for most of an hour.
POINT_SECONDS = 30.0


@dataclass
class ChromaResult:
    ingest_documents_per_second: float
    quality_small: list[list[int]]  # per query: document indices, best first (real documents only)
    quality_full: list[list[int]]  # the same once topped up
    exact_small: list[list[int]]  # exact search over the vectors chromadb stored, and the top-up
    exact_full: list[list[int]]
    points: dict[tuple[int, bool], list[RunStats]] = field(default_factory=dict)  # (concurrency, filtered)
    version: str = ""


def document_index(document_id: str, real: int) -> int:
    """`d12` -> 12, `f3` -> real + 3: the index of a document among the real ones followed by the top-up."""
    return int(document_id[1:]) + (real if document_id[0] == "f" else 0)


async def run_chroma(
    plan: Plan, filler: Vectors, filler_texts: list[str], work_dir: Path, max_length: int
) -> ChromaResult:
    """Install the peer's environment if needed, run it on the same data, and read what it measured."""
    python = await asyncio.to_thread(venv_python, "chromadb", CHROMA_REQUIREMENTS)
    corpus, real = plan.corpus, len(plan.corpus.documents)
    work_dir.mkdir(parents=True, exist_ok=True)
    given = {
        "max_length": max_length,
        "scratch": str(work_dir),
        "ids": [corpus.document_id(i) for i in range(real)],
        "documents": corpus.documents,
        "metadatas": [corpus.metadata(i) for i in range(real)],
        "queries": corpus.queries,
        "filler_ids": [f"f{j}" for j in range(len(filler))],
        "filler_texts": filler_texts,
        "filler_metadatas": [plan.filler_metadata(j) for j in range(len(filler))],
        "ingest_batch": INGEST_BATCH,
        "ingest_concurrency": INGEST_CONCURRENCY,
        "top_k": TOP_K,
        "runs": plan.runs,
        "concurrencies": list(CONCURRENCIES),
        "queries_per_point": plan.queries_per_point,
        "buckets": BUCKETS,
        "point_seconds": POINT_SECONDS,
    }
    (work_dir / "input.json").write_text(json.dumps(given, ensure_ascii=False))
    np.save(work_dir / "filler.npy", filler)
    output = work_dir / "output.json"
    with (work_dir / "chroma.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            str(python), str(PEER_SCRIPT), str(work_dir), str(output), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
        if await process.wait() != 0:
            raise RuntimeError(f"the chromadb peer exited with {process.returncode}; see {work_dir / 'chroma.log'}")
    measured = json.loads(output.read_text())
    result = ChromaResult(
        measured["ingest_documents_per_second"],
        [[document_index(i, real) for i in found] for found in measured["quality_small"]],
        [[document_index(i, real) for i in found] for found in measured["quality_full"]],
        measured["exact_small"],
        measured["exact_full"],
        version=measured["chromadb"],
    )
    for point in measured["points"]:
        stats = RunStats(point["elapsed"], point["latencies"], items=len(point["latencies"]))
        result.points.setdefault((point["concurrency"], point["filtered"]), []).append(stats)
    return result
