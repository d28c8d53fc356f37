from gateway.search.milvus_rows import MAX_TEXT_BYTES, bounded_terms


def test_terms_that_fit_are_kept_whole() -> None:
    terms = "密码 重置 password reset"
    assert bounded_terms(terms) == terms


def test_longer_terms_are_cut_at_a_space_within_the_varchar() -> None:
    terms = " ".join(["重置"] * 20_000)  # 7 bytes a term with its space: 140,000 bytes
    bounded = bounded_terms(terms)
    assert len(bounded.encode()) <= MAX_TEXT_BYTES
    assert set(bounded.split(" ")) == {"重置"}  # whole terms only
    assert len(bounded.encode()) > MAX_TEXT_BYTES - 7  # as many as fit
