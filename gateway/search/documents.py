"""What a vector store holds and answers: collections, documents, hits; and the checks on what clients send."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from gateway.errors import InvalidRequestError
from gateway.search.filters import check_field_name

MetadataValue: TypeAlias = str | int | float | bool | list[str]
Metadata: TypeAlias = dict[str, MetadataValue]
COLLECTION_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
MAX_ID_CHARS = 256
MAX_METADATA_FIELDS = 64
MAX_METADATA_STRING_CHARS = 4096
# Numbers are stored as JSON; integers as 64-bit signed ones (Milvus, Qdrant), so their range is refused beyond.
MIN_METADATA_INT = -(2**63)
MAX_METADATA_INT = 2**63 - 1


@dataclass(frozen=True)
class Chunking:
    """A collection's chunking: spans of at most `max_tokens` tokens, each sharing `overlap` with the one before."""

    max_tokens: int
    overlap: int


@dataclass(frozen=True)
class Collection:
    """A collection's own record; `documents` is counted by the store when it answers."""

    name: str
    model: str
    model_revision: str
    dimensions: int
    created_at: int  # unix seconds
    query_instruction: str | None  # None: the served model's instruction
    metadata: dict[str, Any] = field(default_factory=dict)
    documents: int = 0
    reindex_task: str | None = None  # the re-index job under way: searches and writes wait for it (409)
    lexical: str | None = None  # the analyzer whose terms every document has; None: no lexical index (yet)
    chunking: Chunking | None = None  # None: a document is one point, its text embedded up to the model's maximum

    def counted(self, documents: int) -> Collection:
        return replace(self, documents=documents)

    def record(self) -> dict[str, Any]:
        """What the store persists (the count is the engine's)."""
        return {
            "name": self.name,
            "model": self.model,
            "model_revision": self.model_revision,
            "dimensions": self.dimensions,
            "created_at": self.created_at,
            "query_instruction": self.query_instruction,
            "metadata": self.metadata,
            "reindex_task": self.reindex_task,
            "lexical": self.lexical,
            "chunking": None if self.chunking is None else asdict(self.chunking),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Collection:
        fields = {key: record[key] for key in cls.__dataclass_fields__ if key in record}
        if fields.get("chunking") is not None:
            fields["chunking"] = Chunking(**fields["chunking"])
        return cls(**fields)


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    metadata: Metadata
    created_at: int  # unix seconds; kept when the document is replaced
    updated_at: int


@dataclass(frozen=True)
class ChunkSpan:
    """The chunk a document of a chunked collection was found by: its text and span (code points)."""

    text: str
    start: int
    end: int


@dataclass(frozen=True)
class Hit:
    id: str
    score: float  # the search mode's: cosine similarity (dense), BM25 (lexical), the fused score (hybrid)
    text: str
    metadata: Metadata
    scores: dict[str, float] | None = None  # hybrid: the hit's score in each list that found it, by mode
    chunk: ChunkSpan | None = None  # chunked collections: the document's best chunk


Vector: TypeAlias = npt.NDArray[np.float32]


def check_collection_name(name: str) -> None:
    if not COLLECTION_NAME.match(name):
        raise InvalidRequestError(
            f"collection names start with a letter, then letters, digits, _ or - (at most 63 characters); "
            f"got {name[:80]!r}",
            param="name",
        )


def check_document_id(document_id: str, where: str = "id") -> None:
    if not document_id:
        raise InvalidRequestError(f"{where}: a document id is a non-empty string", param="id")
    if len(document_id) > MAX_ID_CHARS:
        raise InvalidRequestError(
            f"{where}: a document id has at most {MAX_ID_CHARS} characters, got {len(document_id)}", param="id"
        )


def check_metadata(metadata: dict[str, Any], where: str) -> Metadata:
    """`metadata` as stored: a flat object of strings, numbers, booleans and lists of strings."""
    if len(metadata) > MAX_METADATA_FIELDS:
        raise InvalidRequestError(
            f"{where}: at most {MAX_METADATA_FIELDS} metadata fields, got {len(metadata)}", param="metadata"
        )
    for key, value in metadata.items():
        check_field_name(key, f"{where}.{key}")
        if (problem := _value_problem(value, f"{where}.{key}")) is not None:
            raise InvalidRequestError(problem, param="metadata")
    return metadata


def _value_problem(value: object, where: str) -> str | None:
    """What is wrong with one metadata value, said as `<where>: <expected> ... <got>`; None when it is fine."""
    if isinstance(value, str):
        return _string_problem(value, where)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if MIN_METADATA_INT <= value <= MAX_METADATA_INT:
            return None
        return f"{where}: integer {value} out of range [-2**63, 2**63-1]"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where}: number {value} is not finite"
    if isinstance(value, list):
        for index, item in enumerate(value):
            if not isinstance(item, str):
                return f"{where}[{index}]: lists in metadata hold strings only, got {_json_type(item)}"
            if (problem := _string_problem(item, f"{where}[{index}]")) is not None:
                return problem
        return None
    return f"{where}: metadata values are strings, numbers, booleans or lists of strings, got {_json_type(value)}"


def _string_problem(text: str, where: str) -> str | None:
    if len(text) <= MAX_METADATA_STRING_CHARS:
        return None
    return f"{where}: string of {len(text):,} characters > maximum {MAX_METADATA_STRING_CHARS:,}"


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, dict):
        return "an object"
    return "a list" if isinstance(value, list) else "a string" if isinstance(value, str) else type(value).__name__
