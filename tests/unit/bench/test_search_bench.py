"""The search part's figures and corpus on tiny hand-made inputs (no servers, no model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.results import Target
from bench.run_stats import RunStats
from bench.search.chroma import document_index
from bench.search.fill import filler
from bench.search.plan import FILLER_COSINE, GATEWAY_REAL, MILVUS, P99_CONCURRENCY, Plan, load_corpus
from bench.search.quality import exact_ranked, overlap, quality, unit
from bench.search.report import Measured, build_result


def test_quality_counts_the_rank_of_each_right_answer() -> None:
    ranked = [[3, 1, 2], [0, 5], [7, 8, 9]]
    figures = quality(ranked, [3, 5, 4])
    assert figures == {"recall@1": 1 / 3, "recall@10": 2 / 3, "mrr": (1 + 1 / 2) / 3}


def test_exact_ranked_is_best_first_and_overlap_counts_shared_ids() -> None:
    documents = unit(np.array([[1, 0], [0.9, 0.1], [0, 1], [-1, 0]], dtype=np.float32))
    queries = unit(np.array([[1, 0.05], [0.1, 1]], dtype=np.float32))
    exact = exact_ranked(documents, queries, top_k=2)
    assert exact == [[0, 1], [2, 1]]
    assert overlap([[1, 0], [2, 3]], exact, top_k=2) == 3 / 4


def write_pairs(path: Path, rows: list[tuple[str, str, int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("sentence1\tsentence2\tlabel\n" + "".join(f"{a}\t{b}\t{label}\n" for a, b, label in rows))


def test_the_corpus_indexes_second_sentences_and_asks_first_ones(tmp_path: Path) -> None:
    write_pairs(tmp_path / "en/mrpc_test.tsv", [("q1", "d1", 1), ("q2", "d2", 0), ("q3", "d1", 1), ("d1", "d3", 1)])
    write_pairs(tmp_path / "zh/lcqmc_test.tsv", [("问1", "文1", 1)])
    corpus = load_corpus(tmp_path)
    assert corpus.documents == ["d1", "d3", "文1"]  # negatives left out, equal sentences once
    assert corpus.languages == ["en", "en", "zh"]
    assert corpus.queries == ["q1", "q3", "问1"]  # a first sentence that is also a document is no query
    assert [corpus.documents[i] for i in corpus.answers] == ["d1", "d1", "文1"]
    assert corpus.metadata(2) == {"lang": "zh", "bucket": 2}


def test_the_top_up_lies_around_the_real_vectors(tmp_path: Path) -> None:
    write_pairs(tmp_path / "en/mrpc_test.tsv", [(f"q{i}", f"d{i}", 1) for i in range(4)])
    write_pairs(tmp_path / "zh/lcqmc_test.tsv", [("问", "文", 1)])
    plan = Plan(load_corpus(tmp_path), total_documents=505, queries_per_point=1, runs=1, peers=frozenset())
    real = np.eye(5, 384, dtype=np.float32)
    top_up = filler(plan, real)
    assert top_up.vectors.shape == (500, 384)
    assert np.allclose(np.linalg.norm(top_up.vectors, axis=1), 1, atol=1e-5)
    cosines = np.sum(top_up.vectors * real[np.arange(500) % 5], axis=1)
    assert abs(float(cosines.mean()) - FILLER_COSINE) < 0.02
    assert top_up.texts[7] == plan.corpus.documents[2] and plan.filler_metadata(7)["lang"] == "en"
    assert document_index("d3", 5) == 3 and document_index("f7", 5) == 12


def _point(p99_ms: float, cpu_ms: dict[str, float]) -> tuple[list[RunStats], list[dict[str, float]]]:
    return [RunStats(elapsed=1.0, latencies=[p99_ms / 1000] * 100)], [cpu_ms]


def _milvus_target(milvus_p99_ms: float, milvus_cpu_ms: dict[str, float]) -> Target:
    measured = Measured()
    for system, (p99, cpu) in (
        (GATEWAY_REAL, (30.0, {"triton": 3.0, "gateway": 2.0})),
        (MILVUS, (milvus_p99_ms, milvus_cpu_ms)),
    ):
        measured.latency[(system, P99_CONCURRENCY, False)], measured.cpu[(system, P99_CONCURRENCY, False)] = _point(
            p99, cpu
        )
    (target,) = [t for t in build_result(measured, []).targets if "over their CPU per search" in t.name]
    return target


def test_milvus_slower_by_its_cpu_alone_meets_the_target_and_a_wait_beyond_it_does_not() -> None:
    costlier = _milvus_target(60.0, {"triton": 3.0, "gateway": 2.5, "milvus": 4.5})  # 2 x the CPU, 2 x the p99
    assert costlier.met and costlier.measured.startswith("1.00 x")
    waiting = _milvus_target(300.0, {"triton": 3.0, "gateway": 2.5, "milvus": 4.5})  # 10 x the p99: a time tick
    assert not waiting.met and "p99 10.00 x" in waiting.measured
