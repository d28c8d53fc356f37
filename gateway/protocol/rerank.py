"""Wire models of `POST /v1/rerank`, in the shape TEI, Cohere (v2) and Jina users send and read. No logic."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from gateway.protocol.base import RequestModel


class RerankDocumentIn(RequestModel):
    model_config = ConfigDict(extra="forbid")

    text: str


class RerankRequest(RequestModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="The served reranker's name, or 'reranker'; empty: the served one.")
    query: str
    documents: list[str | RerankDocumentIn] = Field(description="1 to 1,000 texts, or {'text': ...} objects.")
    top_n: StrictInt | None = Field(
        None, description="The best this many (at least 1); more than there are documents returns them all."
    )
    return_documents: bool = Field(False, description="Each result carries its document's text.")


class RerankDocumentOut(BaseModel):
    text: str


class RerankResultObject(BaseModel):
    index: int = Field(description="The document's position in the request.")
    relevance_score: float = Field(description="In [0, 1], higher is more relevant: the sigmoid of the model's logit.")
    document: RerankDocumentOut | None = Field(None, description="With return_documents only.")


class RerankUsage(BaseModel):
    prompt_tokens: int = Field(description="Tokens of every (query, document) pair the model read.")
    total_tokens: int


class RerankResponse(BaseModel):
    object: Literal["list"] = "list"
    model: str
    results: list[RerankResultObject] = Field(description="Best first.")
    usage: RerankUsage
