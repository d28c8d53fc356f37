"""OpenAI wire models for embeddings (and the shared error body). No logic."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from gateway.protocol.base import RequestModel


class EmbeddingRequest(RequestModel):
    model_config = ConfigDict(extra="forbid")

    input: str | list[str] = Field(description="A text or a list of texts to embed.")
    model: str | None = Field(None, description="'bge' or the served checkpoint's name; default: the served model.")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="'base64': little-endian float32 bytes, as OpenAI encodes them."
    )
    truncate: StrictBool = Field(
        True, description="Cut texts at the model's maximum tokens; false: such texts are refused with 400."
    )
    input_type: Literal["query", "document"] = Field(
        "document",
        description="'query': the model's query instruction (e.g. BGE's 'Represent this sentence for searching "
        "relevant passages: ') goes in front of each text, as retrieval models expect of search queries; "
        "'document': the texts as they are.",
    )
    user: str | None = Field(None, description="End-user id (accepted for compatibility, not used).")


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    truncated_texts: int = Field(description="Texts cut at the model's maximum tokens.")


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
