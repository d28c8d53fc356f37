"""The optional `reranker` ensemble (`make export-reranker`) through Triton's client: the same Tritons, failover and
error translation as the embeddings."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import tritonclient.grpc.aio as grpcaio
from opentelemetry import propagate, trace

from gateway.errors import UpstreamUnavailableError
from gateway.settings import TritonSettings
from gateway.upstreams.triton import (
    INFO_RETRY_SECONDS,
    TritonClient,
    TritonTimeoutError,
    TritonUnavailableError,
    all_of,
    none_if_unknown,
    text_input,
)

tracer = trace.get_tracer(__name__)
MISSING_RECHECK_SECONDS = 5.0  # how long "no reranker is served" is answered before Triton is asked again
INFO_SECONDS = 30.0  # the config is read again after this: a redeployed reranker may be another revision


@dataclass(frozen=True)
class RerankerInfo:
    """What the reranker ensemble's config says (`python -m export.reranker` writes these parameters)."""

    name: str
    revision: str
    max_batch_size: int
    max_sequence_length: int  # tokens of a query and document together; longer pairs are cut (documents first)


@dataclass(frozen=True)
class TritonScores:
    """One rerank call's outputs, rows in input order."""

    scores: npt.NDArray[np.float32]  # [documents]: the cross-encoder's logit
    token_counts: npt.NDArray[np.int32]  # [documents]: tokens of the query and the document together
    truncated: npt.NDArray[np.bool_]  # [documents]


class RerankerNotServedError(UpstreamUnavailableError):
    """A rerank (`POST /v1/rerank`, gRPC `Rerank.Rerank`, or a search with `rerank`) on a gateway whose Triton serves
    no reranker model.

    Do: operator: export one (`make export-reranker`, e.g. BAAI/bge-reranker-v2-m3) into the model repository and
    restart Triton; `TRITON_RERANKER_MODEL` names the ensemble.
    """

    code = "reranker_not_served"

    def __init__(self, model: str) -> None:
        super().__init__(
            f"no reranker is served: Triton has no model {model!r} (export one with `make export-reranker`)",
            param="model",
        )


class TritonReranker:
    def __init__(self, client: TritonClient, settings: TritonSettings) -> None:
        self._client = client
        self._settings = settings
        self._info: RerankerInfo | None = None
        self._info_until = 0.0
        self._info_lock = asyncio.Lock()
        self._missing_until = 0.0

    async def reranker_info(self) -> RerankerInfo:
        """The reranker ensemble's name, revision and limits; `RerankerNotServedError` where Triton has none.

        Read again every `INFO_SECONDS` by one request while the others wait for it; while Triton is unreachable
        the last info read is answered (asked again at most once a second), so that a brief outage at that moment
        fails no rerank that Triton can answer once back."""
        if self._info is not None and time.monotonic() < self._info_until:
            return self._info
        async with self._info_lock:
            now = time.monotonic()
            if self._info is not None and now < self._info_until:
                return self._info  # read while this request waited
            return await self._read_info(now)

    async def _read_info(self, now: float) -> RerankerInfo:
        model = self._settings.reranker_model
        if now < self._missing_until:
            raise RerankerNotServedError(model)
        settings = self._settings
        timeout = settings.timeout_seconds if self._info is None else settings.ready_timeout_seconds
        try:
            config = await self._client.call(
                none_if_unknown(lambda c, seconds: c.get_model_config(model, client_timeout=seconds)), timeout
            )
        except (TritonUnavailableError, TritonTimeoutError):
            if self._info is None:
                raise
            self._info_until = time.monotonic() + INFO_RETRY_SECONDS
            return self._info
        if config is None:
            self._missing_until = time.monotonic() + MISSING_RECHECK_SECONDS
            raise RerankerNotServedError(model)
        self._info, self._info_until = parse_reranker_info(config), time.monotonic() + INFO_SECONDS
        return self._info

    async def rerank(self, query: str, documents: list[str]) -> TritonScores:
        """Score each (query, document) pair, in chunks of the model's max batch size sent concurrently."""
        size = (await self.reranker_info()).max_batch_size
        if len(documents) <= size:
            return await self._rerank_chunk(query, documents)
        chunks = await all_of(
            [self._rerank_chunk(query, documents[i : i + size]) for i in range(0, len(documents), size)]
        )
        return TritonScores(
            scores=np.concatenate([c.scores for c in chunks]),
            token_counts=np.concatenate([c.token_counts for c in chunks]),
            truncated=np.concatenate([c.truncated for c in chunks]),
        )

    async def _rerank_chunk(self, query: str, documents: list[str]) -> TritonScores:
        inputs = [
            text_input("QUERY", [query] * len(documents)),
            text_input("DOCUMENT", documents),
        ]
        outputs = [grpcaio.InferRequestedOutput(name) for name in ("SCORE", "TOKEN_COUNT", "TRUNCATED")]
        model = self._settings.reranker_model
        with tracer.start_as_current_span("triton.infer", attributes={"triton.model": model}):
            headers: dict[str, str] = {}
            propagate.inject(headers)
            result = await self._client.call(
                lambda c, seconds: c.infer(model, inputs, outputs=outputs, headers=headers, client_timeout=seconds),
                self._settings.timeout_seconds,
                bulk=True,  # every document is a pair the cross-encoder runs: bulk work for the GPU policy
            )
        return TritonScores(
            scores=np.asarray(result.as_numpy("SCORE"), dtype=np.float32).reshape(-1),
            token_counts=np.asarray(result.as_numpy("TOKEN_COUNT"), dtype=np.int32).reshape(-1),
            truncated=np.asarray(result.as_numpy("TRUNCATED"), dtype=np.bool_).reshape(-1),
        )


def parse_reranker_info(response: Any) -> RerankerInfo:
    config = response.config
    params = {key: value.string_value for key, value in config.parameters.items()}
    return RerankerInfo(
        name=params.get("model_name", config.name),
        revision=params.get("model_revision", "unknown"),
        max_batch_size=int(config.max_batch_size) or 1,
        max_sequence_length=int(params.get("max_sequence_length", "512")),
    )
