"""A chunked document's points and back: every character of the text survives, whatever the spans' gaps and
overlaps; a search's chunks become each document once, by its best chunk."""

from __future__ import annotations

import pytest

from gateway.search import chunks
from gateway.search.documents import Document, Hit

TEXT = "  Alpha beta,\tgamma delta.\n\n中文 分词 测试  "


def spans_of(text: str, width: int, step: int) -> list[chunks.Span]:
    """Spans over the text's words (whitespace-free runs), `width` words each, starting every `step` words."""
    words, start = [], None
    for index, char in enumerate(text + " "):
        if not char.isspace() and start is None:
            start = index
        elif char.isspace() and start is not None:
            words.append((start, index))
            start = None
    starts = range(0, max(len(words) - width, 0) + 1, step)
    return [chunks.Span(words[s][0], words[min(s + width, len(words)) - 1][1]) for s in starts]


@pytest.mark.parametrize(("width", "step"), [(1, 1), (2, 1), (2, 2), (3, 2), (20, 1)])
def test_a_document_is_put_back_from_its_points_exactly(width: int, step: int) -> None:
    spans = spans_of(TEXT, width, step)
    points = chunks.points("doc/1", TEXT, {"lang": "zh"}, spans)
    assert [p.text for p in points] == [TEXT[s.start : s.end] for s in spans]
    assert len({p.id for p in points}) == len(points) and all(len(p.id) < 64 for p in points)
    stored = [Document(p.id, p.text, p.metadata, 1, 2) for p in reversed(points)]  # any order
    whole = chunks.whole(stored)
    assert (whole.id, whole.text, whole.metadata, whole.created_at) == ("doc/1", TEXT, {"lang": "zh"}, 1)


def test_a_text_without_tokens_is_one_empty_span() -> None:
    (point,) = chunks.points("d", "   ", {}, [chunks.Span(0, 3)])
    assert chunks.whole([Document(point.id, point.text, point.metadata, 0, 0)]).text == "   "


def test_each_document_once_by_its_best_chunk() -> None:
    points = {p.id: p for p in chunks.points("a", TEXT, {}, spans_of(TEXT, 1, 1))}
    other = chunks.points("b", "x y", {"k": 1}, [chunks.Span(0, 1), chunks.Span(2, 3)])
    hits = [
        Hit(other[1].id, 0.9, other[1].text, other[1].metadata),
        Hit(list(points)[2], 0.8, points[list(points)[2]].text, points[list(points)[2]].metadata),
        Hit(other[0].id, 0.7, other[0].text, other[0].metadata),
    ]
    best = chunks.best_per_document(hits)
    assert [(h.id, h.score, h.metadata) for h in best] == [("b", 0.9, {"k": 1}), ("a", 0.8, {})]
    assert best[0].chunk is not None and (best[0].chunk.text, best[0].chunk.start, best[0].chunk.end) == ("y", 2, 3)
