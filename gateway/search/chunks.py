"""Long documents as chunks: how a chunked collection stores a document, finds it again and gives it back whole.

A collection created with `chunking` splits each document into spans of at most `max_tokens` of the served model's
tokens (Triton's `bge_chunker` draws them), and each span is one point of the store: its own vector, its own terms,
its own text (the span), the document's metadata, and the gateway's own metadata fields below, which are enough to
put the document back together from its points (the text between spans included). Stores need nothing of their
own for this: every operation on a document is one on the points whose `__document` is its id.

Field names starting with `__` are the gateway's: client metadata may not use them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gateway.search.documents import ChunkSpan, Document, Hit, Metadata
from gateway.search.filters import RESERVED_PREFIX, Compare

DOCUMENT = "__document"  # the document's id
INDEX = "__chunk"  # its place, from 0
COUNT = "__chunks"  # how many the document has
START = "__start"  # the span, in code points of the document's text
END = "__end"
BEFORE = "__before"  # the document's text between the previous span's end (or its start) and this span's start
AFTER = "__after"  # the last span: the document's text after it
FIRST = Compare(INDEX, "$eq", 0)  # one point per document: what counts documents


@dataclass(frozen=True)
class Span:
    start: int
    end: int


@dataclass(frozen=True)
class Point:
    """One chunk as the store holds it (the vector and terms are added by the caller)."""

    id: str
    text: str
    metadata: Metadata


def point_id(document_id: str, index: int) -> str:
    """A chunk's id: short and fixed whatever the document's id (the stores cap ids at 256 characters)."""
    return f"{hashlib.sha256(document_id.encode()).hexdigest()[:32]}-{index}"


def points(document_id: str, text: str, metadata: Metadata, spans: Sequence[Span]) -> list[Point]:
    """The document's chunks, in order; `spans` cover its tokens in order, each overlapping the one before at most
    up to its end."""
    made = []
    previous_end = 0
    for index, span in enumerate(spans):
        own: dict[str, Any] = {
            DOCUMENT: document_id,
            INDEX: index,
            COUNT: len(spans),
            START: span.start,
            END: span.end,
            BEFORE: text[previous_end : span.start] if span.start > previous_end else "",
        }
        if index == len(spans) - 1:
            own[AFTER] = text[span.end :]
        made.append(Point(point_id(document_id, index), text[span.start : span.end], {**metadata, **own}))
        previous_end = max(previous_end, span.end)
    return made


def whole(chunks: Sequence[Document]) -> Document:
    """The document its chunks (all of them, any order) came from."""
    ordered = sorted(chunks, key=lambda chunk: _int(chunk.metadata, INDEX))
    parts: list[str] = []
    covered = 0  # the document's text put back so far ends here
    for chunk in ordered:
        start = _int(chunk.metadata, START)
        parts.append(str(chunk.metadata[BEFORE]))
        parts.append(chunk.text[max(covered - start, 0) :])  # the part the previous span did not hold
        covered = max(covered, _int(chunk.metadata, END))
    parts.append(str(ordered[-1].metadata.get(AFTER, "")))
    first = ordered[0]
    return Document(str(first.metadata[DOCUMENT]), "".join(parts), own_metadata(first.metadata),
                    first.created_at, first.updated_at)  # fmt: skip


def own_metadata(metadata: Metadata) -> Metadata:
    """The client's metadata, without the gateway's fields."""
    return {key: value for key, value in metadata.items() if not key.startswith(RESERVED_PREFIX)}


def best_per_document(hits: Iterable[Hit]) -> list[Hit]:
    """Each document once, by its best chunk (hits come best first), with that chunk's span; `id` becomes the
    document's and `text` the chunk's until the document is read back whole."""
    seen: dict[str, Hit] = {}
    for hit in hits:
        document_id = str(hit.metadata[DOCUMENT])
        if document_id not in seen:
            span = ChunkSpan(hit.text, _int(hit.metadata, START), _int(hit.metadata, END))
            seen[document_id] = replace(hit, id=document_id, metadata=own_metadata(hit.metadata), chunk=span)
    return list(seen.values())


def chunk_ids(document_id: str, count: int) -> list[str]:
    return [point_id(document_id, index) for index in range(count)]


def _int(metadata: Metadata, key: str) -> int:
    value = metadata[key]
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"the chunk field {key} holds {value!r}, not a number")
    return int(value)
