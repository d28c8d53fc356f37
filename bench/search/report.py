"""The search part's result: latency points and table, the ingest and quality figures, the targets."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bench.results import PartResult, Point, Target, summarize
from bench.run_stats import RunStats, median
from bench.search.api import Breakdown
from bench.search.plan import (
    GATEWAY,
    GATEWAY_HYBRID,
    GATEWAY_REAL,
    HYBRID_RATIO_GOAL,
    INGEST_GOAL,
    MILVUS,
    MILVUS_WAIT_RATIO,
    P99_CONCURRENCY,
    P99_GOAL_MS,
    PART,
    RECALL_GOAL,
)
from bench.search.quality import Vectors, exact_ranked, overlap, quality
from bench.search.retrieval import SetResult

Key = tuple[str, int, bool]  # system, concurrency, filtered

log = logging.getLogger("bench.search")


@dataclass
class Measured:
    """Everything the part measured, filled in as it goes (a failed step leaves its fields empty)."""

    embed_rates: list[float] = field(default_factory=list)  # /v1/embeddings texts/s, per run
    ingest_rates: list[float] = field(default_factory=list)  # documents/s through the API, per run
    chroma_ingest: float = math.nan
    quality: dict[str, dict[str, float]] = field(default_factory=dict)  # "<stage>: <system>" -> figures
    latency: dict[Key, list[RunStats]] = field(default_factory=dict)
    breakdowns: dict[Key, list[Breakdown]] = field(default_factory=dict)  # the gateway's, per store
    cpu: dict[Key, list[dict[str, float]]] = field(default_factory=dict)  # CPU ms per search, per serving process
    retrieval: list[SetResult] = field(default_factory=list)  # quality per mode on the public sets under --data


def record_quality(
    measured: Measured,
    stage: str,
    ranked: list[list[int]],
    documents: Vectors,
    queries: Vectors,
    answers: list[int],
    *,
    system: str = GATEWAY,
    reference: str = "exact",
) -> None:
    """The system's figures through the API, and exact search's (named `reference`) on the same vectors, which
    bound the system's."""
    exact = exact_ranked(documents, queries)
    measured.quality[f"{stage}: {system}"] = {
        **quality(ranked, answers),
        "top-10 overlap with exact": overlap(ranked, exact),
    }
    measured.quality[f"{stage}: {reference}"] = quality(exact, answers)
    log.info("quality, %s, %s: %s; %s: %s", stage, system, measured.quality[f"{stage}: {system}"], reference,
             measured.quality[f"{stage}: {reference}"])  # fmt: skip


def build_result(measured: Measured, notes: Sequence[str]) -> PartResult:
    result = PartResult(part=PART, x_label="concurrency", throughput_unit="searches/s", notes=list(notes))
    for (system, concurrency, filtered), runs in measured.latency.items():
        label = f"{system}, filter" if filtered else system
        point = summarize(label, concurrency, runs, per="requests")
        result.points.append(point)
        key = (system, concurrency, filtered)
        result.table.append(row(label, point, measured.breakdowns.get(key, []), measured.cpu.get(key, [])))
    embed, ingest = median(measured.embed_rates), median(measured.ingest_rates)
    if measured.ingest_rates:
        # each run's own ratio: the two loads of a run share its moment of the machine
        ratio = median([i / e for i, e in zip(measured.ingest_rates, measured.embed_rates, strict=True)])
        result.notes.insert(
            0,
            f"Ingest: {ingest:.0f} documents/s through POST /v1/collections/{{name}}/documents (64 a request, 4 in "
            f"flight, the ingest CLI's code) against {embed:.0f} texts/s of 32-text /v1/embeddings requests (4 in "
            f"flight), ratio {ratio:.2f}; chromadb (its embedding function on the same graph, same batches): "
            f"{measured.chroma_ingest:.0f} documents/s. Medians of {len(measured.ingest_rates)} runs (the ratio: of "
            f"each run's ratio).",
        )
        met = ratio >= INGEST_GOAL
        result.targets.append(Target("ingest documents/s vs /v1/embeddings texts/s", f">= {INGEST_GOAL} x",
                                     f"{ratio:.2f} x ({ingest:.0f} vs {embed:.0f})", met))  # fmt: skip
    for stage, figures in measured.quality.items():
        shown = ", ".join(f"{name} {value:.3f}" for name, value in figures.items())
        result.notes.append(f"Quality, {stage}: {shown}")
    for stage, system, reference, name in (
        ("real documents", GATEWAY, "exact", "through the API"),
        ("topped up", GATEWAY, "exact", "through the API"),
        ("real documents", MILVUS, f"exact on {MILVUS}'s vectors", "through Milvus"),
    ):
        engine, exact = measured.quality.get(f"{stage}: {system}"), measured.quality.get(f"{stage}: {reference}")
        if engine and exact:
            ratio = engine["recall@10"] / exact["recall@10"]
            result.targets.append(
                Target(f"recall@10 {name} vs exact, {stage}", f">= {RECALL_GOAL} x",
                       f"{ratio:.3f} x ({engine['recall@10']:.3f} vs {exact['recall@10']:.3f})", ratio >= RECALL_GOAL)
            )  # fmt: skip
    for filtered in (False, True):
        swept = measured.latency.get((GATEWAY, P99_CONCURRENCY, filtered))
        if swept:
            p99 = median([run.p(99) for run in swept])
            result.targets.append(
                Target(f"search p99, concurrency {P99_CONCURRENCY}{', filter' if filtered else ''}",
                       f"<= {P99_GOAL_MS:.0f} ms", f"{p99:.1f} ms", p99 <= P99_GOAL_MS)
            )  # fmt: skip
        hybrid = measured.latency.get((GATEWAY_HYBRID, P99_CONCURRENCY, filtered))
        if swept and hybrid:  # the same queries, each run's dense and hybrid points back to back
            ratio = median([h.p(99) / d.p(99) for h, d in zip(hybrid, swept, strict=False)])
            result.targets.append(
                Target(f"hybrid search p99 vs dense, concurrency {P99_CONCURRENCY}{', filter' if filtered else ''}",
                       f"<= {HYBRID_RATIO_GOAL} x", f"{ratio:.2f} x ({median([h.p(99) for h in hybrid]):.1f} ms)",
                       ratio <= HYBRID_RATIO_GOAL)
            )  # fmt: skip
        milvus, embedded = (measured.latency.get((s, P99_CONCURRENCY, filtered)) for s in (MILVUS, GATEWAY_REAL))
        if milvus and embedded:  # the same documents, the same queries, one run
            slower = median([run.p(99) for run in milvus]) / median([run.p(99) for run in embedded])
            cpu = [cpu_per_search(measured.cpu.get((s, P99_CONCURRENCY, filtered), [])) for s in (MILVUS, GATEWAY_REAL)]
            costlier = cpu[0] / cpu[1]
            result.targets.append(
                Target(f"search p99 through Milvus vs the embedded store, over their CPU per search, real documents, "
                       f"concurrency {P99_CONCURRENCY}{', filter' if filtered else ''}", f"<= {MILVUS_WAIT_RATIO} x",
                       f"{slower / costlier:.2f} x (p99 {slower:.2f} x; CPU per search {costlier:.2f} x: {cpu[0]:.1f} "
                       f"vs {cpu[1]:.1f} ms)", slower / costlier <= MILVUS_WAIT_RATIO)
            )  # fmt: skip
    result.targets.extend(retrieval_targets(measured.retrieval))
    return result


# Published nDCG@10 of the default model (MTEB, all-MiniLM-L6-v2) and of BM25 (the BEIR paper, Elasticsearch).
PUBLISHED_DENSE = {"scifact": 0.645, "nfcorpus": 0.316}
PUBLISHED_BM25 = {"scifact": 0.665, "nfcorpus": 0.325}
HYBRID_GAIN = 0.02  # hybrid over the better of dense and lexical, on the English sets


def retrieval_targets(results: Sequence[SetResult]) -> list[Target]:
    """Each mode's nDCG@10 through the API against the published figures, and hybrid against the better mode."""
    targets = []
    for result in results:
        ndcg = {mode: figures["ndcg@10"] for mode, figures in result.scores.items()}
        if result.name in PUBLISHED_DENSE:
            goal = PUBLISHED_DENSE[result.name] - 0.005
            targets.append(Target(f"{result.name}: dense nDCG@10 vs the model's published", f">= {goal:.3f}",
                                  f"{ndcg['dense']:.3f}", ndcg["dense"] >= goal))  # fmt: skip
            goal = PUBLISHED_BM25[result.name] - 0.01
            targets.append(Target(f"{result.name}: lexical nDCG@10 vs BEIR's BM25", f">= {goal:.3f}",
                                  f"{ndcg['lexical']:.3f}", ndcg["lexical"] >= goal))  # fmt: skip
        gain = HYBRID_GAIN if result.name in PUBLISHED_DENSE else 0.0
        better = max(ndcg["dense"], ndcg["lexical"])
        best_hybrid = max(ndcg["hybrid"], ndcg.get("hybrid, tuned", 0.0))
        targets.append(Target(f"{result.name}: hybrid nDCG@10 over the better of dense and lexical",
                              f">= +{gain:.2f}", f"{best_hybrid - better:+.3f} ({best_hybrid:.3f} vs {better:.3f})",
                              best_hybrid - better >= gain))  # fmt: skip
        if "dense, chunked" in ndcg:
            targets.append(Target(f"{result.name}: chunked vs truncated dense nDCG@10", "chunked above",
                                  f"{ndcg['dense, chunked']:.3f} vs {ndcg['dense']:.3f}",
                                  ndcg["dense, chunked"] > ndcg["dense"]))  # fmt: skip
    return targets


def cpu_per_search(runs: Sequence[Mapping[str, float]]) -> float:
    """The CPU milliseconds all serving processes together spent per search at one point (median over runs)."""
    return median([sum(spent.values()) for spent in runs])


def row(
    label: str, point: Point, breakdowns: Sequence[Breakdown], cpu: Sequence[Mapping[str, float]]
) -> dict[str, object]:
    """One latency row; the gateway's carries the means of where the time went (its own histograms) and the CPU
    each serving process spent per search."""
    cells: dict[str, object] = {
        "system": label,
        "concurrency": int(point.x),
        "searches/s": point.throughput,
        "p50 ms": point.p50_ms,
        "p99 ms": point.p99_ms,
        "errors": int(point.extra.get("errors", 0)),
    }
    if breakdowns:
        cells.update(means(breakdowns))
    if cpu:
        cells["CPU ms/search"] = cpu_per_search(cpu)
        cells.update({f"of which {name}": median([spent[name] for spent in cpu]) for name in cpu[0]})
    return cells


def means(breakdowns: Sequence[Breakdown]) -> Mapping[str, float]:
    return {
        "gateway mean ms": median([b.http_ms for b in breakdowns]),
        "query embedding ms": median([b.embedding_ms for b in breakdowns]),
        "store search ms": median([b.store_ms for b in breakdowns]),
        "rest ms": median([b.rest_ms for b in breakdowns]),
    }
