"""Real grpc.aio servers on free ports over an in-memory fake embedding backend (and, if given, a video backend).

The servers run on an event loop in a background thread; tests call them through real channels with the
generated (synchronous) stubs, so the tests themselves stay plain functions.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import numpy as np
import pytest

from gateway.grpc import codegen

# Before anything imports `gateway.grpc.pb` (the test modules do, at collection).
codegen.ensure_generated()

from gateway.errors import (  # noqa: E402
    GatewayError,
    InputTooLongError,
    InvalidRequestError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from gateway.grpc.pb.gateway.v1 import gateway_pb2_grpc  # noqa: E402
from gateway.grpc.server import GrpcServer, create_grpc_server  # noqa: E402
from gateway.grpc.servicer import ModelsBackend, VideoBackend  # noqa: E402
from gateway.keys.gatekeeper import Gatekeeper  # noqa: E402
from gateway.keys.limiter import LocalKeyLimiter  # noqa: E402
from gateway.keys.resolver import KeyResolver, env_keys  # noqa: E402
from gateway.limits import InFlightLimit  # noqa: E402
from gateway.services.embeddings import EmbeddingResult  # noqa: E402

T = TypeVar("T")

API_KEY = "test-key"
AUTH = (("authorization", f"Bearer {API_KEY}"),)
SECRET = "do-not-leak: db password hunter2"

# Magic input texts that make the fake raise; built per call so no traceback is shared between tests.
FAILURES: dict[str, Callable[[], Exception]] = {
    "!invalid": lambda: InvalidRequestError("input[0]: expected a non-empty string, got ''"),
    "!too-long": lambda: InputTooLongError("input[0]: 700 tokens > maximum 512 with truncate=false"),
    "!not-found": lambda: NotFoundError("model 'nope' not found; served: fake/default"),
    "!too-large": lambda: PayloadTooLargeError("request of 9000000 bytes > maximum 8388608"),
    "!overloaded": lambda: OverloadedError("256 requests in flight, limit 256", retry_after=7),
    "!upstream": lambda: UpstreamError("triton answered an unexpected error"),
    "!unavailable": lambda: UpstreamUnavailableError("triton at 127.0.0.1:8001 is not reachable"),
    "!timeout": lambda: UpstreamTimeoutError("triton did not answer within 30.0 s"),
    "!server": lambda: GatewayError("embedding cache returned a malformed vector"),
    "!crash": lambda: RuntimeError(SECRET),
    "!long": lambda: NotFoundError(f"task {'x' * 20_000!r} not found"),  # an error quoting a huge input
}


@dataclass
class EmbedCall:
    texts: list[str]
    model: str | None
    truncate: bool
    use_cache: bool


@dataclass
class FakeBackend:
    """Deterministic stand-in for EmbeddingService: vector = [len(text), 1, -1], one token per character + 2."""

    is_ready: bool = True
    calls: list[EmbedCall] = field(default_factory=list)

    async def embed(
        self,
        texts: list[str],
        *,
        model: str | None = None,
        truncate: bool = True,
        use_cache: bool = True,
        input_type: str = "document",
    ) -> EmbeddingResult:
        self.calls.append(EmbedCall(texts, model, truncate, use_cache))
        if "!slow" in texts:
            await asyncio.sleep(30)
        for text in texts:
            if text in FAILURES:
                raise FAILURES[text]()
        return EmbeddingResult(
            vectors=np.array([[len(text), 1.0, -1.0] for text in texts], dtype=np.float32).reshape(len(texts), 3),
            model=model or "fake/default",
            prompt_tokens=sum(len(text) + 2 for text in texts),
            truncated_texts=sum(len(text) > 8 for text in texts) if truncate else 0,
            cache="hit" if use_cache else "miss",
            cached_texts=len(texts) if use_cache else 0,
        )

    async def ready(self) -> bool:
        return self.is_ready


class LoopThread:
    """An asyncio event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="grpc-test-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()


@dataclass
class Harness:
    """One started server, its fake backend and an open channel to it."""

    server: GrpcServer
    backend: FakeBackend
    channel: grpc.Channel
    loop: LoopThread

    @property
    def embeddings(self) -> gateway_pb2_grpc.EmbeddingsStub:
        return gateway_pb2_grpc.EmbeddingsStub(self.channel)

    @property
    def images(self) -> gateway_pb2_grpc.ImagesStub:
        return gateway_pb2_grpc.ImagesStub(self.channel)

    @property
    def models(self) -> gateway_pb2_grpc.ModelsStub:
        return gateway_pb2_grpc.ModelsStub(self.channel)


HarnessFactory = Callable[..., Harness]


@pytest.fixture(scope="module")
def loop_thread() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.close()


@pytest.fixture
def harness_factory(loop_thread: LoopThread) -> Iterator[HarnessFactory]:
    """Start servers (keys: the API keys, () for none; handlers: extra generic handlers; images: an image
    backend, which also serves gateway.v1.Images; models: a model listing, which also serves gateway.v1.Models;
    in_flight, watchers, timeout_seconds and max_message_bytes: the process's limits);
    all stop at teardown."""
    started: list[Harness] = []

    async def build(backend: FakeBackend, keys: Sequence[str], handlers: Sequence[Any], **options: Any) -> GrpcServer:
        gatekeeper = Gatekeeper(KeyResolver(env_keys([key.encode() for key in keys])), LocalKeyLimiter())
        server = create_grpc_server(backend, gatekeeper, host="127.0.0.1", port=0, **options)
        server.server.add_generic_rpc_handlers(tuple(handlers))
        await server.start()
        return server

    def start(
        keys: Sequence[str] = (API_KEY,),
        handlers: Sequence[Any] = (),
        images: VideoBackend | None = None,
        models: ModelsBackend | None = None,
        in_flight: InFlightLimit | None = None,
        timeout_seconds: float | None = None,
        max_message_bytes: int | None = None,
        watchers: InFlightLimit | None = None,
    ) -> Harness:
        backend = FakeBackend()
        options = {
            "video": images,
            "models": models,
            "in_flight": in_flight,
            "watchers": watchers,
            "timeout_seconds": timeout_seconds,
            "max_message_bytes": max_message_bytes,
        }
        server = loop_thread.run(build(backend, keys, handlers, **options))
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        started.append(Harness(server, backend, channel, loop_thread))
        return started[-1]

    yield start
    for harness in started:
        harness.channel.close()
        loop_thread.run(harness.server.stop(None))


@pytest.fixture
def harness(harness_factory: HarnessFactory) -> Harness:
    return harness_factory()
