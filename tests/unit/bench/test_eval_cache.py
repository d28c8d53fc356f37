"""The cache evaluation's sweep, recommendation and reports on a tiny synthetic set (no real data, no model)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.eval_cache import (
    OVERALL,
    THRESHOLDS,
    Pair,
    Recommendation,
    evaluate,
    load_pairs,
    markdown_report,
    pair_similarities,
    recommend,
    roc_auc,
    sample_pairs,
    sweep,
)
from gateway.cache.semantic import SimHashMatcher

# Five paraphrases and five non-paraphrases with hand-set similarities.
SIMILARITIES = np.array([0.99, 0.95, 0.90, 0.85, 0.60, 0.91, 0.80, 0.75, 0.50, 0.20])
LABELS = np.array([1, 1, 1, 1, 1, 0, 0, 0, 0, 0], dtype=np.int64)


def test_thresholds_cover_the_requested_ranges() -> None:
    assert THRESHOLDS["embedding"][0] == 0.70 and THRESHOLDS["embedding"][-1] == 0.99
    assert THRESHOLDS["simhash"][-1] == 1.00
    assert len(THRESHOLDS["embedding"]) == 30 and len(THRESHOLDS["simhash"]) == 31


def test_sweep_counts_pairs_at_or_above_each_threshold() -> None:
    rows = sweep(SIMILARITIES, LABELS, [0.5, 0.85, 0.91, 0.96, 1.0])
    assert [(r.threshold, r.hit_rate, r.false_hit_rate) for r in rows] == [
        (0.5, 1.0, 0.8),
        (0.85, 0.8, 0.2),
        (0.91, 0.4, 0.2),
        (0.96, 0.2, 0.0),
        (1.0, 0.0, 0.0),
    ]
    assert {(r.positives, r.negatives) for r in rows} == {(5, 5)}


def test_sweep_of_a_class_without_pairs_is_zero() -> None:
    (row,) = sweep(np.array([0.9, 0.8]), np.array([1, 1], dtype=np.int64), [0.85])
    assert (row.hit_rate, row.false_hit_rate, row.negatives) == (0.5, 0.0, 0)


def test_sweep_gives_the_false_hits_share_of_the_hits() -> None:
    rows = sweep(SIMILARITIES, LABELS, [0.80, 0.90, 0.92, 1.0])
    assert [r.false_share for r in rows] == [2 / 6, 1 / 4, 0.0, 0.0]


def test_recommend_picks_the_lowest_threshold_within_the_false_share_budget() -> None:
    rows = sweep(SIMILARITIES, LABELS, [0.80, 0.90, 0.92, 0.95])
    assert recommend(rows) == Recommendation(0.92, 0.4, 0.0, 0.0)
    assert recommend(rows, max_false_share=0.25) == Recommendation(0.90, 0.6, 0.2, 0.25)
    assert recommend(list(reversed(rows))) == Recommendation(0.92, 0.4, 0.0, 0.0)


def test_recommend_never_picks_a_threshold_without_hits() -> None:
    assert recommend(sweep(SIMILARITIES, LABELS, [1.0])) is None


def test_recommend_none_when_every_threshold_serves_too_many_false_hits() -> None:
    assert recommend(sweep(SIMILARITIES, LABELS, [0.5, 0.6])) is None


def test_roc_auc() -> None:
    assert roc_auc(np.array([0.9, 0.8, 0.1]), np.array([1, 1, 0], dtype=np.int64)) == 1.0
    assert roc_auc(np.array([0.5, 0.5]), np.array([1, 0], dtype=np.int64)) == 0.5
    assert roc_auc(SIMILARITIES, LABELS) == pytest.approx(20.0 / 25)


def test_evaluate_pools_languages_into_overall() -> None:
    result = evaluate(
        {"en": SIMILARITIES[[0, 1, 5, 6]], "zh": SIMILARITIES[[2, 3, 4, 7, 8, 9]]},
        {"en": LABELS[[0, 1, 5, 6]], "zh": LABELS[[2, 3, 4, 7, 8, 9]]},
        [0.9, 0.92],
    )
    assert set(result["sweep"]) == {"en", "zh", OVERALL}
    assert result["sweep"][OVERALL] == [
        {"threshold": 0.9, "hit_rate": 0.6, "false_hit_rate": 0.2, "positives": 5, "negatives": 5, "false_share": 0.25},
        {"threshold": 0.92, "hit_rate": 0.4, "false_hit_rate": 0.0, "positives": 5, "negatives": 5, "false_share": 0.0},
    ]
    assert result["recommended"][OVERALL] == {
        "threshold": 0.92, "hit_rate": 0.4, "false_hit_rate": 0.0, "false_share": 0.0
    }  # fmt: skip
    assert result["recommended"]["zh"] == {
        "threshold": 0.9,
        "hit_rate": 1 / 3,
        "false_hit_rate": 0.0,
        "false_share": 0.0,
    }


def test_markdown_report_has_a_table_and_the_recommendation(tmp_path: Path) -> None:
    result = evaluate({"en": SIMILARITIES}, {"en": LABELS}, [0.9, 0.92])
    meta = {"pairs_per_language": {"en": 10}, "seed": 0, "embedding_model": "m.onnx", "wall_seconds": 1.0}
    report = markdown_report(
        {"simhash": result, "embedding": evaluate({"en": SIMILARITIES}, {"en": LABELS}, [0.5])}, meta
    )
    assert "## simhash" in report and "## embedding" in report
    assert "**Recommended threshold: 0.92** (hit rate 0.400, false-hit rate 0.000, false share 0.000 overall)" in report
    assert "| 0.90 | 0.600 | 0.200 | 0.250 | 0.600 | 0.200 | 0.250 |" in report
    assert "No threshold keeps false hits <= 1% of the hits." in report
    json.dumps(result)  # the raw numbers are JSON as they are


def test_load_and_sample_pairs(tmp_path: Path) -> None:
    path = tmp_path / "pairs.tsv"
    lines = ["sentence1\tsentence2\tlabel"] + [f"a{i}\tb{i}\t{i % 2}" for i in range(20)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    pairs = load_pairs(path)
    assert pairs[:2] == [Pair("a0", "b0", 0), Pair("a1", "b1", 1)] and len(pairs) == 20
    assert sample_pairs(pairs, 5, seed=3) == sample_pairs(pairs, 5, seed=3)
    assert sample_pairs(pairs, 5, seed=3) != sample_pairs(pairs, 5, seed=4)
    assert len(set(sample_pairs(pairs, 5, seed=3))) == 5
    assert sorted(sample_pairs(pairs, 100, seed=0), key=lambda p: p.sentence1) == sorted(
        pairs, key=lambda p: p.sentence1
    )


def test_load_pairs_rejects_a_bad_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.tsv"
    path.write_text("s1\ts2\tlabel\nonly two\tfields\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.tsv:2: expected 3 tab-separated fields"):
        load_pairs(path)


async def test_pair_similarities_use_the_gateway_matcher() -> None:
    pairs = [Pair("reset my password", "reset my password", 1), Pair("reset my password", "weather in Paris", 0)]
    scores = await pair_similarities(SimHashMatcher(), pairs)
    assert scores[0] == 1.0 and scores[1] < 0.8


def test_plot_writes_a_png(tmp_path: Path) -> None:
    from bench.eval_cache import plot

    results = {
        "simhash": evaluate({"en": SIMILARITIES, "zh": SIMILARITIES[::-1]}, {"en": LABELS, "zh": LABELS}, [0.8, 0.9])
    }
    plot(results, tmp_path / "cache_eval.png")
    assert (tmp_path / "cache_eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
