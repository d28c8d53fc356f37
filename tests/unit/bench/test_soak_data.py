"""What the soak sends: seeded documents and questions whose paraphrase groups judge the semantic cache."""

from __future__ import annotations

from pathlib import Path

from bench.soak.data import TEMPLATES, labelled, synthetic


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
