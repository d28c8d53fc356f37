import threading

import pytest

from gateway.search import analyzer
from gateway.services.search_terms import INLINE_CHARS, query_terms


@pytest.mark.parametrize("repeat", [1, INLINE_CHARS])
async def test_a_query_is_analyzed_on_the_loop_when_short_and_on_a_worker_when_long(
    repeat: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query of up to the longest text a request may send would hold the event loop for tens of milliseconds."""
    threads: list[int] = []
    analyze = analyzer.analyze

    def recorded(text: str) -> str:
        threads.append(threading.get_ident())
        return analyze(text)

    monkeypatch.setattr("gateway.services.search_terms.analyze", recorded)
    query = "重置密码 reset " * repeat
    assert await query_terms(query) == analyze(query)
    assert (threads == [threading.get_ident()]) is (len(query) <= INLINE_CHARS)
