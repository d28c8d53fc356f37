"""The retrieval bench's nDCG@10 and Recall@100 are trec_eval's (`pytrec_eval` runs trec_eval's own code): graded
judgements, ties, queries with no result and documents judged 0 included."""

from __future__ import annotations

import random

import pytest
import pytrec_eval

from bench.search.retrieval import Run, ndcg_at, recall_at
from bench.search.retrieval_sets import Qrels


def random_case(seed: int) -> tuple[Run, Qrels]:
    rng = random.Random(seed)
    documents = [f"d{n}" for n in range(300)]
    qrels: Qrels = {}
    run: Run = {}
    for query in (f"q{n}" for n in range(40)):
        qrels[query] = {d: rng.choice((0, 1, 1, 2)) for d in rng.sample(documents, rng.randint(1, 6))}
        if rng.random() < 0.1:
            continue  # a query the engine answered nothing for
        ranked = rng.sample(documents, 120)
        run[query] = {d: float(rng.randint(0, 30)) for d in ranked}  # many ties
        for d in qrels[query]:
            if rng.random() < 0.6:
                run[query][d] = 31.0 + rng.random()
    return run, qrels


@pytest.mark.parametrize("seed", range(5))
def test_the_metrics_are_trec_evals(seed: int) -> None:
    run, qrels = random_case(seed)
    per_query = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run)
    expected_ndcg = sum(per_query.get(q, {}).get("ndcg_cut_10", 0.0) for q in qrels) / len(qrels)
    expected_recall = sum(per_query.get(q, {}).get("recall_100", 0.0) for q in qrels) / len(qrels)
    assert ndcg_at(run, qrels, 10) == pytest.approx(expected_ndcg, abs=1e-9)
    assert recall_at(run, qrels, 100) == pytest.approx(expected_recall, abs=1e-9)
