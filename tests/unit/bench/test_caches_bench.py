"""The cache benchmark's workload (deterministic, the right mix, each follow-up after its original), its
counting of hits and false hits, and one quick end-to-end run on synthetic pairs (no research data needed)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bench import caches
from bench.caches import Answered, Question, build_workload, distinct_pairs, load_data, rates, tally
from bench.eval_cache import Pair

# Synthetic pairs: label 1 differ by a word or two (SimHash reaches 0.88 on some), label 0 share a topic only.
SYNTHETIC = {
    "en": [
        Pair("How do I reset my router password at home?", "How do I reset my router password at home", 1),
        Pair("What is the capital city of Australia?", "Which city is the capital of Australia?", 1),
        Pair("How long should I boil an egg for a soft yolk?", "How long do I boil an egg to get a soft yolk?", 1),
        Pair("Is it safe to swim right after eating lunch?", "Is it safe to swim right after eating lunch today?", 1),
        Pair("How do I renew my passport online?", "How do I renew my driving licence online?", 0),
        Pair("What time does the central library open on Sundays?", "What time does the museum close on Sundays?", 0),
    ],
    "zh": [
        Pair("英雄联盟什么英雄最好", "英雄联盟最好英雄是什么", 1),
        Pair("怎么样才能快速减肥呢", "怎么样才能快速减肥", 1),
        Pair("北京明天会下雨吗", "上海明天会下雨吗", 0),
        Pair("苹果手机怎么截图", "华为手机怎么录屏", 0),
    ],
}


def test_the_workload_is_deterministic_and_shuffled_by_seed() -> None:
    first = build_workload(SYNTHETIC, seed=3)
    assert first == build_workload(SYNTHETIC, seed=3)
    assert first != build_workload(SYNTHETIC, seed=4)


def test_each_pair_gives_a_new_question_a_repeat_and_its_second_sentence() -> None:
    workload = build_workload(SYNTHETIC, seed=0)
    assert len(workload) == 3 * 10
    assert Counter(q.kind for q in workload) == {"new": 10, "repeat": 10, "paraphrase": 6, "non_paraphrase": 4}
    assert Counter(q.language for q in workload) == {"en": 18, "zh": 12}
    for pair in range(10):
        kinds = [q.kind for q in workload if q.pair == pair]
        assert kinds[0] == "new" and sorted(kinds[1:])[0] in ("non_paraphrase", "paraphrase")
        new, *later = [q for q in workload if q.pair == pair]
        assert all(q.original == new.text for q in later)
        assert next(q for q in later if q.kind == "repeat").text == new.text


def test_follow_ups_come_in_both_orders_across_seeds() -> None:
    orders = set()
    for seed in range(20):
        workload = build_workload(SYNTHETIC, seed=seed)
        orders.add(tuple(q.kind for q in workload if q.pair == 0)[1])
    assert orders == {"repeat", "paraphrase"}


def test_pairs_that_reuse_a_sentence_are_left_out() -> None:
    pairs = [
        ("en", Pair("a question", "another wording", 1)),
        ("en", Pair("a question", "something else", 0)),  # its first sentence was already asked
        ("zh", Pair("同一句", "同一句", 1)),  # no paraphrase at all
        ("zh", Pair("一个问题", "another wording", 0)),  # its second sentence was already asked
        ("zh", Pair("新问题", "新的问题", 1)),
    ]
    assert distinct_pairs(pairs) == [pairs[0], pairs[4]]


def test_a_paraphrase_may_get_its_originals_answer_nothing_else_may() -> None:
    paraphrase = Question("b", "paraphrase", 0, "en", "a")
    assert paraphrase.right_answers() == ("b", "a")
    assert Question("c", "non_paraphrase", 1, "en", "d").right_answers() == ("c",)
    assert Question("a", "repeat", 0, "en", "a").right_answers() == ("a",)


def test_tally_and_rates_count_hits_and_false_hits() -> None:
    def answered(kind: str, cache: str, right: bool, pair_original: bool = False, language: str = "en") -> Answered:
        question = Question("q", kind, 0, language, "o")  # type: ignore[arg-type]
        return Answered(question, cache, right, pair_original, 0.001)

    replay = [
        answered("new", "miss", True),
        answered("repeat", "hit", True),
        answered("paraphrase", "semantic", True),
        answered("paraphrase", "miss", True),
        answered("non_paraphrase", "semantic", False, pair_original=True),
        answered("non_paraphrase", "miss", True),
        answered("new", "semantic", False, language="zh"),  # matched another pair's question
    ]
    assert tally(replay) == {
        "requests": 7,
        "exact hits": 1,
        "semantic hits": 3,
        "right semantic hits": 1,
        "false hits": 2,
        "labelled false hits": 1,
        "misses": 3,
    }
    assert rates(replay, "en") == {"paraphrase hit rate": 0.5, "non-paraphrase false-hit rate": 0.5}


def test_missing_data_fails_with_the_paths_it_looked_for(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"mrpc_test\.tsv"):
        load_data(tmp_path, 10)


def test_load_data_draws_distinct_pairs_per_language(tmp_path: Path) -> None:
    for language, file in (("en", "en/mrpc_test.tsv"), ("zh", "zh/lcqmc_test.tsv")):
        rows = [f"{p.sentence1}\t{p.sentence2}\t{p.label}" for p in SYNTHETIC[language]]
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / file).write_text("\n".join(["sentence1\tsentence2\tlabel", *rows]) + "\n", encoding="utf-8")
    pairs = load_data(tmp_path, 3)
    assert {language: len(group) for language, group in pairs.items()} == {"en": 3, "zh": 3}
    assert pairs == load_data(tmp_path, 3)


@pytest.mark.slow
async def test_quick_run_replays_through_a_real_gateway(tmp_path: Path) -> None:
    result = await caches.run(tmp_path, runs=1, quick=True, pairs=SYNTHETIC)
    totals = [row for row in result.table if row["questions"] == "all"]
    assert len(totals) == len(caches.CONFIGS)
    for row in totals:
        assert row["requests"] == 30
        assert row["exact hits"] == row["saved by exact"] == 10  # every repeat, counted alike by client and gateway
        assert row["semantic hits"] == row["saved by semantic"]
        assert row["upstream calls"] == row["misses"] == 30 - 10 - row["semantic hits"]
    assert any("paraphrase hit rate" in note for note in result.notes)
