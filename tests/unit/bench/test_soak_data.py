"""What the soak sends: seeded documents and questions whose paraphrase groups judge the semantic cache; where it
writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak.data import TEMPLATES, labelled, synthetic
from bench.soak.part import Options, run_soak
from bench.soak.teams import default_teams
from bench.soak.traffic import CHAT_PARTNER_RATE, CHAT_REPEAT_RATE, Load


def test_the_synthetic_questions_are_seeded_and_different_groups_differ_in_more_than_one_word() -> None:
    corpus = synthetic(7)
    assert [q.text for q in corpus.questions] == [q.text for q in synthetic(7).questions]
    assert len(corpus.questions) == len(TEMPLATES) * len({q.group for q in corpus.questions}) >= 400
    first = corpus.questions[0].text
    same_group = [q.text for q in corpus.questions if q.group == corpus.questions[0].group and q.text != first]
    other = next(q.text for q in corpus.questions if q.group != corpus.questions[0].group)
    assert all(corpus.same_meaning(first, text) for text in same_group)
    assert corpus.same_meaning(first, other) is False
    assert corpus.same_meaning(first, "never asked") is None
    assert sorted(corpus.partners[first]) == sorted(same_group)  # the paraphrases the load asks after it
    assert corpus.document(12) == synthetic(7).document(12) != corpus.document(13)


def test_labelled_pairs_put_paraphrases_in_one_group_and_the_rest_apart(tmp_path: Path) -> None:
    (tmp_path / "en").mkdir()
    (tmp_path / "en" / "mrpc_test.tsv").write_text(
        "sentence1\tsentence2\tlabel\nhow do I reset it\thow can I reset it\t1\nhow do I reset it\twhere is it\t0\n"
    )
    corpus = labelled(tmp_path, seed=0)
    assert corpus.same_meaning("how do I reset it", "how can I reset it")
    assert corpus.same_meaning("how do I reset it", "where is it") is False
    assert len(corpus.questions) == 3
    # Both sides of every pair are partners, the near miss too: the load asks them as the data pairs them.
    assert corpus.partners["how do I reset it"] == ["how can I reset it", "where is it"]
    assert corpus.partners["where is it"] == ["how do I reset it"]


def test_the_chat_load_asks_recent_questions_again_and_their_partners(tmp_path: Path) -> None:
    (tmp_path / "en").mkdir()
    pairs = "".join(f"question {n} asked\tquestion {n} put otherwise\t{n % 2}\n" for n in range(20_000))
    (tmp_path / "en" / "mrpc_test.tsv").write_text("sentence1\tsentence2\tlabel\n" + pairs)
    corpus = labelled(tmp_path, seed=0)
    load = Load("http://127.0.0.1:1", corpus, default_teams(), collection_size=10, seed=5)
    asked: set[str] = set()
    repeats = partners = 0
    for _ in range(3000):
        question = load.question()
        if question in asked:
            repeats += 1  # at CHAT_REPEAT_RATE, and a partner's partner (the question it was paired from)
        elif any(partner in asked for partner in corpus.partners[question]):
            partners += 1
        asked.add(question)
    assert CHAT_REPEAT_RATE - 0.03 < repeats / 3000 < CHAT_REPEAT_RATE + CHAT_PARTNER_RATE
    assert 0.4 * CHAT_PARTNER_RATE < partners / 3000 < CHAT_PARTNER_RATE + 0.03
    assert len(asked) > 1500  # the rest are new questions


async def test_a_soak_refuses_an_output_folder_that_holds_an_earlier_run(tmp_path: Path) -> None:
    """An earlier run's Redis append-only file and usage stores would come back in the new run's platform."""
    (tmp_path / "redis").mkdir()
    (tmp_path / "redis" / "appendonly.aof").write_text("*1\r\n")
    with pytest.raises(SystemExit, match="not empty"):
        await run_soak(Options(tmp_path))
