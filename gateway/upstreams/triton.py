"""Triton's `bge` ensemble over gRPC: one asyncio channel at a time, replaced when it has aged (`triton_channels`).

`InferenceServerException` never leaves this module: it becomes one of the
`Triton*Error` classes below. Clients are told `triton unavailable`, never Triton's address: the address
goes to the log, once when an outage starts (WARNING) and once when it ends (INFO).

`TRITON_URL` may be `dns:///host:port`: with a headless Service the name resolves to every Triton pod and
the `round_robin` policy spreads calls over them (a plain `host:port` resolves the same way; with a
ClusterIP there is one address and kube-proxy picks a pod per connection, i.e. once). The name is resolved again
when the channel is replaced, every `TRITON_CHANNEL_MAX_AGE_SECONDS`, so that Triton pods added since get calls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import tritonclient.grpc.aio as grpcaio
from opentelemetry import propagate, trace
from tritonclient.utils import InferenceServerException

from gateway import metrics
from gateway.errors import InvalidRequestError, UpstreamError, UpstreamTimeoutError, UpstreamUnavailableError
from gateway.settings import TritonSettings
from gateway.upstreams.triton_channels import AgingClient

tracer = trace.get_tracer(__name__)
log = logging.getLogger(__name__)

# Reconnect quickly after a Triton restart (gRPC's default back-off grows to minutes: while it lasts, calls
# fail at once although Triton is back; a refused connect costs nothing), lift the 4 MB message cap (64 texts
# of 100,000 characters exceed it), and spread calls over every address the name resolves to. Each channel
# keeps its own connections (gRPC otherwise shares them between channels of the same target), so that a
# replaced channel's connections close with it.
CHANNEL_ARGS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 250),
    ("grpc.lb_policy_name", "round_robin"),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.use_local_subchannel_pool", 1),
]
INFO_RETRY_SECONDS = 1.0  # while Triton is unreachable, how often a request re-reads the model info


class TritonUpstreamError(UpstreamError):
    """Triton answered with an error we did not expect."""


class TritonUnavailableError(UpstreamUnavailableError):
    def __init__(self, message: str = "triton unavailable", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)


class TritonTimeoutError(UpstreamTimeoutError):
    pass


class TritonInvalidInputError(InvalidRequestError):
    pass


@dataclass(frozen=True)
class ModelInfo:
    """What the served model's config says (the export writes these parameters)."""

    name: str
    revision: str
    max_batch_size: int
    max_sequence_length: int
    dimension: int
    query_instruction: str = ""  # what the model wants before a search query (the export records it)

    @property
    def variant(self) -> str:
        """What a text's vector and `truncated` flag depend on besides the text: the checkpoint's revision
        and the token limit texts are cut at (the embedding cache keys on it)."""
        return f"{self.revision}/max-tokens-{self.max_sequence_length}"


@dataclass(frozen=True)
class TritonEmbeddings:
    """One call's outputs, rows in input order."""

    vectors: npt.NDArray[np.float32]  # [texts, dimension]
    token_counts: npt.NDArray[np.int32]  # [texts]
    truncated: npt.NDArray[np.bool_]  # [texts]


class TritonClient:
    """Async client of the `bge` ensemble; use as an async context manager or call `aclose`."""

    def __init__(
        self, settings: TritonSettings, open_client: Callable[[], grpcaio.InferenceServerClient] | None = None
    ) -> None:
        self._settings = settings
        self._clients = AgingClient(
            open_client or (lambda: grpcaio.InferenceServerClient(settings.url, channel_args=CHANNEL_ARGS)),
            settings.channel_max_age_seconds,
        )
        self._info: ModelInfo | None = None
        self._info_stale = False  # Triton was unreachable since it was read: the model may be another revision
        self._info_retry_at = 0.0
        self._info_lock = asyncio.Lock()
        self._outage = False  # the last call found Triton unreachable or not serving the model
        metrics.TRITON_UP.set(1)

    async def __aenter__(self) -> TritonClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def open_channels(self) -> int:
        """Channels not closed yet: 1, plus replaced ones whose calls have not ended."""
        return self._clients.open_clients

    async def aclose(self) -> None:
        await self._clients.aclose()

    async def model_info(self, *, refresh: bool = False) -> ModelInfo:
        """The model's name, revision and limits, read once and again after Triton was unreachable.

        While Triton stays unreachable the last info read is answered (re-read at most once a second), so
        that embeddings the cache holds are still served."""
        info = self._info
        if info is not None and not self._re_read_due(refresh) and not self._info_lock.locked():  # nor running
            return info
        async with self._info_lock:
            if self._info is None or self._re_read_due(refresh):
                # A re-read is quick or given up: requests wait on it, cache hits included.
                settings = self._settings
                timeout = settings.timeout_seconds if self._info is None else settings.ready_timeout_seconds
                try:
                    config = await self._call(lambda c: c.get_model_config(settings.model, client_timeout=timeout))
                except (TritonUnavailableError, TritonTimeoutError):
                    if self._info is None or refresh:
                        raise
                    self._info_retry_at = time.monotonic() + INFO_RETRY_SECONDS
                    return self._info
                self._info = parse_model_info(config)
                self._info_stale = False
            return self._info

    def _re_read_due(self, refresh: bool) -> bool:
        return refresh or (self._info_stale and time.monotonic() >= self._info_retry_at)

    async def ready(self) -> bool:
        """Whether `bge` is ready; refreshes the model info so a redeployed model's revision is seen."""
        try:
            with self._clients.lease() as client:
                ready = await asyncio.wait_for(
                    client.is_model_ready(self._settings.model), self._settings.ready_timeout_seconds
                )
            if ready:
                await asyncio.wait_for(self.model_info(refresh=True), self._settings.ready_timeout_seconds)
                self._recovered()
            else:
                self._went_away("the model is not ready")
            return bool(ready)
        except InferenceServerException as exc:
            self._went_away(str(exc.message() or exc))
            return False
        except (
            TritonUnavailableError,
            TritonTimeoutError,
            TritonUpstreamError,
            TimeoutError,
        ):
            return False

    async def embed(self, texts: list[str]) -> TritonEmbeddings:
        """Embed `texts`, in chunks of the model's max batch size sent concurrently, re-joined in order."""
        info = await self.model_info()
        size = info.max_batch_size
        if len(texts) <= size:  # one call: awaited here, not in a task of its own as gather would
            return await self._embed_chunk(texts)
        chunks = await asyncio.gather(*(self._embed_chunk(texts[i : i + size]) for i in range(0, len(texts), size)))
        return TritonEmbeddings(
            vectors=np.concatenate([c.vectors for c in chunks]),
            token_counts=np.concatenate([c.token_counts for c in chunks]),
            truncated=np.concatenate([c.truncated for c in chunks]),
        )

    async def _embed_chunk(self, texts: list[str]) -> TritonEmbeddings:
        raw = np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
        text = grpcaio.InferInput("TEXT", list(raw.shape), "BYTES")
        text.set_data_from_numpy(raw)
        outputs = [grpcaio.InferRequestedOutput(name) for name in ("EMBEDDING", "TOKEN_COUNT", "TRUNCATED")]
        metrics.EMBEDDING_BATCH_SIZE.observe(len(texts))
        with tracer.start_as_current_span("triton.infer", attributes={"triton.model": self._settings.model}):
            headers: dict[str, str] = {}
            propagate.inject(headers)  # trace context travels to Triton as gRPC metadata
            started = time.perf_counter()
            result = await self._call(
                lambda c: c.infer(
                    self._settings.model,
                    [text],
                    outputs=outputs,
                    headers=headers,
                    client_timeout=self._settings.timeout_seconds,
                )
            )
            metrics.TRITON_LATENCY.observe(time.perf_counter() - started)
        return TritonEmbeddings(
            vectors=np.asarray(result.as_numpy("EMBEDDING"), dtype=np.float32),
            token_counts=np.asarray(result.as_numpy("TOKEN_COUNT"), dtype=np.int32).reshape(-1),
            truncated=np.asarray(result.as_numpy("TRUNCATED"), dtype=np.bool_).reshape(-1),
        )

    async def _call(self, call: Callable[[grpcaio.InferenceServerClient], Awaitable[Any]]) -> Any:
        """`call` on the current tritonclient, its errors translated."""
        try:
            with self._clients.lease() as client:
                result = await call(client)
        except InferenceServerException as exc:
            error = translate(exc, self._settings)
            if isinstance(error, TritonUnavailableError):
                self._info_stale = True  # the model may come back as another revision
                self._went_away(str(exc.message() or exc))
            metrics.TRITON_ERRORS.labels(reason=_reason(error)).inc()
            raise error from exc
        self._recovered()
        return result

    def _went_away(self, why: str) -> None:
        """One WARNING per outage, with the address the client is not told."""
        if not self._outage:
            self._outage = True
            metrics.TRITON_UP.set(0)
            log.warning("triton unavailable at %s (model %s): %s", self._settings.url, self._settings.model, why)

    def _recovered(self) -> None:
        if self._outage:
            self._outage = False
            metrics.TRITON_UP.set(1)
            log.info("triton available again at %s (model %s)", self._settings.url, self._settings.model)


def parse_model_info(response: Any) -> ModelInfo:
    config = response.config
    params = {key: value.string_value for key, value in config.parameters.items()}
    embedding = next(o for o in config.output if o.name == "EMBEDDING")
    return ModelInfo(
        name=params.get("model_name", config.name),
        revision=params.get("model_revision", "unknown"),
        max_batch_size=int(config.max_batch_size) or 1,
        max_sequence_length=int(params.get("max_sequence_length", "512")),
        dimension=int(embedding.dims[-1]),
        query_instruction=params.get("query_instruction", ""),
    )


def translate(exc: InferenceServerException, settings: TritonSettings) -> UpstreamError | InvalidRequestError:
    status = str(exc.status() or "")
    message = str(exc.message() or exc)
    if "DEADLINE_EXCEEDED" in status or "Deadline Exceeded" in message:
        return TritonTimeoutError(f"triton did not answer within {settings.timeout_seconds:g} s")
    if "UNAVAILABLE" in status or "unknown model" in message or "not ready" in message:
        return TritonUnavailableError()
    if "INVALID_ARGUMENT" in status:
        return TritonInvalidInputError(message.removeprefix("in ensemble 'bge', "))
    return TritonUpstreamError(f"Triton failed: {message}")


def _reason(error: Exception) -> str:
    if isinstance(error, TritonUnavailableError):
        return "unavailable"
    if isinstance(error, TritonTimeoutError):
        return "timeout"
    if isinstance(error, TritonInvalidInputError):
        return "invalid"
    return "error"
