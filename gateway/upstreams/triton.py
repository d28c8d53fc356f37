"""Triton's `bge` ensemble over gRPC, on every Triton `TRITON_URL` names (`triton_endpoints`); the optional
models (`triton_reranker`, `triton_chunker`) make their calls through the same client.

`InferenceServerException` never leaves this module: it becomes one of the `Triton*Error` classes below. Clients
are told `triton unavailable`, never Triton's address: the address goes to the log, once when an outage of that
Triton starts (WARNING) and once when it ends (INFO).

Every call this client makes is idempotent, so a call that finds its Triton unavailable (shutting down, gone,
unreachable, killed mid-call) is made once more on another Triton within what is left of its deadline: a graceful
stop or a kill of one Triton of several fails no request. A deadline that passed, a bad input or a model error is
answered as it is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import tritonclient.grpc.aio as grpcaio
from opentelemetry import propagate, trace
from tritonclient.utils import InferenceServerException

from gateway import metrics
from gateway.errors import (
    InvalidRequestError,
    OverloadedError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from gateway.settings import TritonSettings
from gateway.upstreams.triton_endpoints import Rank, Resolver, TritonEndpoint, TritonEndpoints, resolve_host

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
# Triton's answers while it shuts down (the port stays open until it exits) and while the model loads.
# Triton's answers when a model's bounded queue (the export's `default_queue_policy`) refuses a call: full, or
# waited past its bound. Triton says UNAVAILABLE for both, but that Triton is serving: it is overloaded, not out.
QUEUE_FULL_MESSAGES = ("Exceeds maximum queue size", "Request timeout expired")
UNAVAILABLE_MESSAGES = ("unknown model", "not ready", "stopped accepting", "no available versions", "shutting down")

TritonCall = Callable[[grpcaio.InferenceServerClient, float], Awaitable[Any]]  # (client, timeout seconds)
T = TypeVar("T")


class TritonUpstreamError(UpstreamError):
    """Triton answered an embedding call with an error the gateway does not expect (not unavailable, a
    timeout, or invalid input).

    Do: client: retry later; operator: Triton's log for the message (`gateway_triton_errors_total`).
    """


class TritonUnavailableError(UpstreamUnavailableError):
    """No Triton answers an embedding call: down, restarting, or without the model loaded (a call is tried
    once more on another Triton first). Texts in the embedding cache are still served.

    Do: client: retry later; operator: Triton's log and `/v2/models/bge/ready`; `gateway_triton_up`.
    """

    def __init__(self, message: str = "triton unavailable", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)


class TritonQueueFullError(OverloadedError):
    """Triton's queue in front of a model was full, or the call waited there past its bound, on this Triton and
    on another where there is one: answered as the gateway's own load shedding is (429 `overloaded`).

    Do: client: retry after `Retry-After` seconds, with back-off; operator: Triton needs more instances or
    replicas (`gateway_model_queue_rejections_total{queue="triton"}`).
    """

    def __init__(self, message: str = "triton is overloaded: its model queue is full; retry shortly") -> None:
        super().__init__(message)


class TritonTimeoutError(UpstreamTimeoutError):
    """A Triton call took longer than `TRITON_TIMEOUT_SECONDS`.

    Do: client: retry, with fewer texts; operator: Triton's queue time: a saturated Triton needs scaling.
    """


class TritonInvalidInputError(InvalidRequestError):
    """Triton refused an embedding call's inputs (its `INVALID_ARGUMENT`); the message is Triton's.

    Do: client: change the input as the message says; operator: if well-formed input is refused, the exported
    model and the gateway disagree (Triton's log).
    """


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
        self,
        settings: TritonSettings,
        open_client: Callable[[str], grpcaio.InferenceServerClient] | None = None,
        *,
        resolve: Resolver = resolve_host,
        rank: Rank | None = None,
    ) -> None:
        self._settings = settings
        self._endpoints = TritonEndpoints(
            settings.url,
            open_client or (lambda address: grpcaio.InferenceServerClient(address, channel_args=CHANNEL_ARGS)),
            model=settings.model,
            max_age_seconds=settings.channel_max_age_seconds,
            probe_timeout_seconds=settings.ready_timeout_seconds,
            resolve=resolve,
            rank=rank,
        )
        self._info: ModelInfo | None = None
        self._info_stale = False  # a Triton was unreachable since it was read: the model may be another revision
        self._info_retry_at = 0.0
        self._info_lock = asyncio.Lock()
        metrics.TRITON_UP.set(1)

    async def __aenter__(self) -> TritonClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def addresses(self) -> list[str]:
        """The Triton addresses calls go to now (empty until a name is first resolved)."""
        return self._endpoints.addresses

    @property
    def open_channels(self) -> int:
        """Channels not closed yet: one per address, plus replaced ones whose calls have not ended."""
        return self._endpoints.open_channels

    async def aclose(self) -> None:
        await self._endpoints.aclose()

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
                    config = await self.call(
                        lambda c, seconds: c.get_model_config(settings.model, client_timeout=seconds), timeout
                    )
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
        """Whether `bge` is ready on some Triton (each address is asked, and put in or out of rotation by its
        answer); refreshes the model info so a redeployed model's revision is seen."""
        endpoints = await self._endpoints.current()
        answers = await asyncio.gather(*(self._endpoints.probe(e) for e in endpoints))
        if not any(answers):
            return False
        try:
            await asyncio.wait_for(self.model_info(refresh=True), self._settings.ready_timeout_seconds)
        except (TritonUnavailableError, TritonTimeoutError, TritonUpstreamError, TimeoutError):
            return False
        return True

    async def embed(self, texts: list[str]) -> TritonEmbeddings:
        """Embed `texts`, in chunks of the model's max batch size sent concurrently, re-joined in order."""
        info = await self.model_info()
        size = info.max_batch_size
        if len(texts) <= size:  # one call: awaited here, not in a task of its own
            return await self._embed_chunk(texts)
        chunks = await all_of([self._embed_chunk(texts[i : i + size]) for i in range(0, len(texts), size)])
        return TritonEmbeddings(
            vectors=np.concatenate([c.vectors for c in chunks]),
            token_counts=np.concatenate([c.token_counts for c in chunks]),
            truncated=np.concatenate([c.truncated for c in chunks]),
        )

    async def _embed_chunk(self, texts: list[str]) -> TritonEmbeddings:
        text = text_input("TEXT", texts)
        outputs = [grpcaio.InferRequestedOutput(name) for name in ("EMBEDDING", "TOKEN_COUNT", "TRUNCATED")]
        metrics.EMBEDDING_BATCH_SIZE.observe(len(texts))
        with tracer.start_as_current_span("triton.infer", attributes={"triton.model": self._settings.model}):
            headers: dict[str, str] = {}
            propagate.inject(headers)  # trace context travels to Triton as gRPC metadata
            started = time.perf_counter()
            result = await self.call(
                lambda c, seconds: c.infer(
                    self._settings.model, [text], outputs=outputs, headers=headers, client_timeout=seconds
                ),
                self._settings.timeout_seconds,
                bulk=len(texts) > 1,
            )
            metrics.TRITON_LATENCY.observe(time.perf_counter() - started)
        return TritonEmbeddings(
            vectors=np.asarray(result.as_numpy("EMBEDDING"), dtype=np.float32),
            token_counts=np.asarray(result.as_numpy("TOKEN_COUNT"), dtype=np.int32).reshape(-1),
            truncated=np.asarray(result.as_numpy("TRUNCATED"), dtype=np.bool_).reshape(-1),
        )

    async def call(self, call: TritonCall, timeout: float, *, bulk: bool = False) -> Any:
        """`call` (idempotent: every call this client makes is) on the next Triton in rotation; where that one is
        unavailable (stopping, gone, unreachable) or its queue refused the call, once more on another within what
        is left of `timeout` (never again on the same one: its queue is what refused it). `bulk`: a call of several
        texts, which a Triton short of GPU memory should not get while another has room (`triton_endpoints`)."""
        try:
            return await self._call_with_retry(call, timeout, bulk)
        except TritonQueueFullError:
            # Once per refusal the caller gets: not for a Triton's refusal another Triton then served.
            metrics.MODEL_QUEUE_REJECTIONS.labels(queue="triton").inc()
            raise

    async def _call_with_retry(self, call: TritonCall, timeout: float, bulk: bool) -> Any:
        deadline = time.monotonic() + timeout
        endpoint = await self._endpoints.pick(bulk=bulk)
        if endpoint is None:
            metrics.TRITON_ERRORS.labels(reason="unavailable").inc()
            raise TritonUnavailableError()
        try:
            return await self._call_on(endpoint, call, timeout)
        except TritonUnavailableError:
            other = await self._endpoints.pick(exclude=endpoint, bulk=bulk)
            if other is None or (left := deadline - time.monotonic()) <= 0:
                raise
            metrics.TRITON_RETRIES.inc()
            return await self._call_on(other, call, left)
        except TritonQueueFullError as refused:
            # Only a Triton in rotation may take it: one out of it would answer unavailable (503, and the model
            # info marked stale) for what is overload (429).
            other = await self._endpoints.pick(exclude=endpoint, bulk=bulk, serving_only=True)
            if other is None or (left := deadline - time.monotonic()) <= 0:
                raise
            metrics.TRITON_RETRIES.inc()
            try:
                return await self._call_on(other, call, left)
            except TritonUnavailableError:
                raise refused from refused.__cause__  # the other went out meanwhile: still overloaded, not out

    async def _call_on(self, endpoint: TritonEndpoint, call: TritonCall, timeout: float) -> Any:
        """`call` on `endpoint`'s tritonclient, its errors translated."""
        outages = endpoint.outages
        try:
            with endpoint.lease() as client:
                result = await call(client, timeout)
        except InferenceServerException as exc:
            error = translate(exc, self._settings)
            if isinstance(error, TritonUnavailableError):
                self._info_stale = True  # the model may come back as another revision
                await self._endpoints.failed(endpoint, str(exc.message() or exc))
            metrics.TRITON_ERRORS.labels(reason=_reason(error)).inc()
            raise error from exc
        self._endpoints.recovered(endpoint, outages)
        return result


async def all_of(calls: list[Coroutine[Any, Any, T]]) -> list[T]:
    """The calls' results in order, run concurrently. The first to fail cancels the others (a request's chunks are
    all or nothing: the rest would only load Triton) and its error is raised as it is, not in an ExceptionGroup,
    so that the client is answered as for one call (a full queue: 429)."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(call) for call in calls]
    except BaseExceptionGroup as failed:
        error = failed.exceptions[0]
        raise error from error.__cause__
    return [task.result() for task in tasks]


def none_if_unknown(call: TritonCall) -> TritonCall:
    """`call`, answering None where Triton has no such model: an optional model (the reranker, the chunker of a
    repository exported before it) that it lacks is not an outage of that Triton."""

    async def called(client: grpcaio.InferenceServerClient, seconds: float) -> Any:
        try:
            return await call(client, seconds)
        except InferenceServerException as exc:
            if "unknown model" in str(exc.message() or exc):
                return None
            raise

    return called


def text_input(name: str, texts: list[str], shape: list[int] | None = None) -> grpcaio.InferInput:
    """A [len(texts), 1] BYTES input of UTF-8 texts (or of `shape`: a model that takes no batch)."""
    raw = np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
    if shape is not None:
        raw = raw.reshape(shape)
    tensor = grpcaio.InferInput(name, list(raw.shape), "BYTES")
    tensor.set_data_from_numpy(raw)
    return tensor


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


def translate(
    exc: InferenceServerException, settings: TritonSettings
) -> UpstreamError | InvalidRequestError | TritonQueueFullError:
    status = str(exc.status() or "")
    message = str(exc.message() or exc)
    if any(text in message for text in QUEUE_FULL_MESSAGES):
        return TritonQueueFullError()
    if "DEADLINE_EXCEEDED" in status or "Deadline Exceeded" in message:
        return TritonTimeoutError(f"triton did not answer within {settings.timeout_seconds:g} s")
    if "UNAVAILABLE" in status or any(text in message for text in UNAVAILABLE_MESSAGES):
        return TritonUnavailableError()
    if "INVALID_ARGUMENT" in status:
        return TritonInvalidInputError(message.removeprefix(f"in ensemble '{settings.model}', "))
    return TritonUpstreamError(f"Triton failed: {message}")


def _reason(error: Exception) -> str:
    if isinstance(error, TritonUnavailableError):
        return "unavailable"
    if isinstance(error, TritonTimeoutError):
        return "timeout"
    if isinstance(error, TritonQueueFullError):
        return "queue_full"
    if isinstance(error, TritonInvalidInputError):
        return "invalid"
    return "error"
