"""The search part's quality targets: each mode against the published figure, hybrid against the better mode."""

from __future__ import annotations

from bench.search.report import retrieval_targets
from bench.search.retrieval import SetResult


def result(name: str, **ndcg: float) -> SetResult:
    scores = {mode.replace("_", ", "): {"ndcg@10": value, "recall@100": 1.0} for mode, value in ndcg.items()}
    return SetResult(name, 10, 5, scores, None, [], {}, {})


def test_each_mode_is_held_to_its_published_figure_and_hybrid_to_the_better_mode() -> None:
    english = result("scifact", dense=0.641, lexical=0.654, hybrid=0.70, hybrid_tuned=0.69, dense_chunked=0.66)
    chinese = result("lcqmc", dense=0.43, lexical=0.938, hybrid=0.78, hybrid_tuned=0.936)
    met = {t.name: t.met for t in retrieval_targets([english, chinese])}
    assert met == {
        "scifact: dense nDCG@10 vs the model's published": True,  # 0.641 >= 0.645 - 0.005
        "scifact: lexical nDCG@10 vs BEIR's BM25": False,  # 0.654 < 0.665 - 0.01
        "scifact: hybrid nDCG@10 over the better of dense and lexical": True,  # 0.70 >= 0.654 + 0.02
        "scifact: chunked vs truncated dense nDCG@10": True,
        "lcqmc: hybrid nDCG@10 over the better of dense and lexical": False,  # 0.936 < 0.938
    }
