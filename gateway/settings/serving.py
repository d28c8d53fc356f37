"""The gateway's own server, its Triton, and what it reports: ports and limits of a request, Triton's address
and calls, traces."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServerSettings(BaseSettings):
    """Where the gateway listens, how it shuts down, and the URL at which upstreams reach it."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", frozen=True)

    host: str = Field("0.0.0.0", description="Address both servers bind to.")
    http_port: int = Field(8080, description="REST (FastAPI) port.")
    grpc_port: int = Field(50051, description="gRPC port (package gateway.v1).")
    shutdown_grace_seconds: float = Field(
        20.0,
        description="On SIGTERM, seconds in-flight requests get to finish before they are cut off. The clients "
        "then get 15 s to close; a close still waiting after that is abandoned (logged) and the process exits.",
    )
    header_timeout_seconds: float = Field(
        15.0,
        description="A connection that does not complete a request's headers this long after it opened or its "
        "last response ended is closed (idle and slow-header connections would otherwise hold sockets for ever).",
    )
    keepalive_seconds: float = Field(
        75.0,
        description="An idle keep-alive HTTP connection is closed after this long (uvicorn's timeout_keep_alive). "
        "Keep it above the keep-alive of the proxy in front (nginx: 60 s), so that the proxy closes idle "
        "connections first: a request sent on a connection the gateway is closing gets 502 from the proxy.",
    )
    grpc_max_connection_age_seconds: float = Field(
        300.0,
        description="gRPC connections are told to reconnect (GOAWAY) after this long, so that clients with "
        "long-lived channels spread over replicas added since (0: never).",
    )
    grpc_max_connection_age_grace_seconds: float = Field(
        300.0,
        description="Calls in flight on an aged gRPC connection get this long to finish (a chat stream may "
        "last CHAT_TOTAL_TIMEOUT_SECONDS) before it is closed.",
    )
    ws_ping_seconds: float = Field(
        20.0,
        ge=0,
        description="The gateway pings each WebSocket this often, and closes one whose pong does not come within the "
        "same time (1011): quiet sockets stay open through proxies' idle timeouts (nginx: 60 s), and dead peers free "
        "their watchers. Lower: dead peers found sooner, a small frame each way per socket and interval; 0: no pings.",
    )
    cors_allow_origins: str = Field(
        "",
        description="Comma-separated browser origins (scheme://host[:port], e.g. https://app.example.com) allowed to "
        "call the REST API from a page (CORS, preflights answered without a key) and to open WebSockets (their "
        "Origin is checked at the handshake; a socket from any other origin is refused with 403). `*`: any origin. "
        "Empty: no cross-origin calls, and WebSockets only from clients that send no Origin (not browsers).",
    )
    log_level: str = Field("INFO", description="Log level of the JSON logs.")
    public_url: str | None = Field(
        None,
        description="Base URL at which the upstreams reach this gateway (e.g. https://ai.example.com), used for "
        "webhook callbacks. Unset: no webhooks are requested and video tasks are polled from the start.",
    )

    def allowed_origins(self) -> list[str]:
        """GATEWAY_CORS_ALLOW_ORIGINS as a list, each without a trailing slash."""
        return [origin.strip().rstrip("/") for origin in self.cors_allow_origins.split(",") if origin.strip()]


class TritonSettings(BaseSettings):
    """The Triton server that computes the embeddings, and how the gateway calls it."""

    model_config = SettingsConfigDict(env_prefix="TRITON_", frozen=True)

    url: str = Field(
        "127.0.0.1:8001",
        description="Triton's gRPC address: host:port or dns:///host:port (resolved by the gateway, IPv4 first), or "
        "ipv4:host:port,host:port. Calls go round robin over every address, one channel each: give a headless "
        "Service's name to spread them over all Triton pods. A call that finds its Triton stopping or gone is made "
        "once more on another within its deadline, and that Triton gets no calls until its model is ready again.",
    )
    model: str = Field("bge", description="Ensemble that maps TEXT to EMBEDDING.")
    chunker_model: str = Field(
        "bge_chunker",
        description="Model that splits a text into spans of the served model's tokens (installed by `make export`), "
        "for collections created with `chunking`.",
    )
    reranker_model: str = Field(
        "reranker",
        description="Ensemble that maps QUERY and DOCUMENT to SCORE (`make export-reranker`); where Triton has none, "
        "reranks answer 503 `reranker_not_served`.",
    )
    timeout_seconds: float = Field(
        30.0, description="Deadline of one Triton call; longer waits fail with 504 instead of piling up."
    )
    ready_timeout_seconds: float = Field(1.0, description="Deadline of the readiness probe's call to Triton.")
    channel_max_age_seconds: float = Field(
        300.0,
        ge=0,
        description="How often the gateway resolves TRITON_URL again (a failed call resolves it at once, at most "
        "once a second), so that Triton pods added since (scale-out, a rollout) get their share of calls, and "
        "how old a channel gets before new calls go on a fresh one (behind a ClusterIP, a new connection may land "
        "on another pod); a replaced channel is closed once its calls end (none is cut). Lower: new pods are found "
        "sooner, one lookup and handshake more per interval; 0: resolved once, one channel per address for ever.",
    )
    max_in_flight_calls: int = Field(
        1,
        description="Triton calls this gateway keeps in flight. Requests arriving while all are busy are merged "
        "into the next call (up to the model's max batch size), and one call more goes as soon as as many texts "
        "wait as the running call carries, or when what is left of it is one text's encoding (timed from the "
        "calls the encoder served), so that the encoder need not wait for a round trip: fewer, larger calls "
        "under load, no added delay when quiet. Higher: more parallel calls, smaller batches; worth it where "
        "Triton has its own cores or GPU and the network round trip is to be hidden (the Helm chart sets 4). With "
        "Triton on the gateway's cores, 1 is best: the encoder gets the largest batches and no call competes with "
        "it for the cores.",
    )

    max_queue_seconds: float = Field(
        2.0,
        gt=0,
        description="Texts that would wait behind more than this many seconds of encoding in the gateway's queue "
        "for Triton (what is left of the calls in flight and the texts already waiting, at the encoder's measured "
        "pace) are refused at once with 429 `overloaded` and Retry-After, like the in-flight limit's refusals: an "
        "overloaded model answers some requests quickly and refuses the rest, instead of making all of them wait "
        "until their deadline. A request that can go at once is never refused. Higher: bulk clients at high "
        "concurrency wait rather than retry; lower: shorter worst waits, earlier refusals.",
    )


class ObservabilitySettings(BaseSettings):
    """Tracing (OpenTelemetry); metrics are always on at /metrics."""

    model_config = SettingsConfigDict(frozen=True, populate_by_name=True)

    otlp_endpoint: str | None = Field(
        None,
        validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT",
        description="OTLP collector; set it to turn tracing on.",
    )
    service_name: str = Field("ai-gateway", validation_alias="OTEL_SERVICE_NAME", description="Service name in traces.")
