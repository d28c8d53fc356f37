"""Structured JSON logs, the request id, and per-request metrics and server spans (pure ASGI)."""

from __future__ import annotations

import json
import logging
import random
import re
import time
from contextvars import ContextVar
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import metrics

REQUEST_ID_HEADER = "x-request-id"
_REQUEST_ID_KEY = REQUEST_ID_HEADER.encode()
request_id: ContextVar[str] = ContextVar("request_id", default="-")
_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_RESERVED = set(vars(logging.makeLogRecord({})))
log = logging.getLogger("gateway.access")


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the request id and any `extra=` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": request_id.get(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class WebSocketWireFilter(logging.Filter):
    """Drops what uvicorn's WebSocket protocol logs of the wire: a line per handshake with the client's address and
    the URL with its query (INFO), and the handshake's headers and every frame (DEBUG: `< authorization: Bearer ...`,
    a watch token in `sec-websocket-protocol`). Secrets must not reach the logs at any level; the task sockets log
    a line of their own when they close (`gateway.routes.task_sockets`)."""

    WIRE_PREFIXES = ("< ", "> ", "= ", "x ", "! ", "% ")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg if isinstance(record.msg, str) else ""
        return not (message.startswith(self.WIRE_PREFIXES) or message.startswith('%s - "WebSocket '))


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = name != "uvicorn.access"  # our access log replaces uvicorn's
    logging.getLogger("uvicorn.error").addFilter(WebSocketWireFilter())


PYMILVUS_LOGGERS = ("pymilvus", "pymilvus.milvus_client", "pymilvus.bulk_writer")


def quiet_pymilvus() -> None:
    """Call after importing pymilvus, which installs plain-text handlers of its own at import and, while Milvus is
    down, logs a traceback for every failed reconnect and every failed call. The Milvus store's failures are logged
    by the gateway (one line per failed request, `gateway.errors`) and counted, so pymilvus' records go to the
    gateway's JSON handler, critical ones only."""
    for name in PYMILVUS_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
        logger.setLevel(logging.CRITICAL)


def new_request_id() -> str:
    """32 hex digits, as `uuid.uuid4().hex` writes them (version 4, RFC 4122 variant), without building a UUID.
    The bits come from `random`, seeded from the OS and again in each forked worker: an id must be unique, not
    secret (it names a request in logs, traces and usage records, and grants nothing), and a system call per
    request for it cost more than the rest of the request id's work."""
    value = random.getrandbits(128) & ~(0xF000 << 64 | 0xC000 << 48) | (0x4000 << 64 | 0x8000 << 48)
    return f"{value:032x}"


def client_request_id(scope: Scope) -> str | None:
    """The client's request id when it sent a well-formed one."""
    for name, value in scope["headers"]:
        if name == _REQUEST_ID_KEY:
            rid = value.decode("latin-1")
            return rid if _VALID_REQUEST_ID.match(rid) else None
    return None


class RequestContextMiddleware:
    """Request id (kept from the client when well-formed), latency by route, access log.

    Server spans come from FastAPI's own OpenTelemetry support (see `create_app`)."""

    MAX_LATENCY_CHILDREN = 1024  # a method is the client's string: past this many, labels are looked up each time

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        # The histogram's children by (method, route, status), bound once: `labels()` costs a lock and a tuple.
        self._latency: dict[tuple[str, str, int], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = client_request_id(scope) or new_request_id()
        token = request_id.set(rid)
        status = 500
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (_REQUEST_ID_KEY, rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            route = getattr(scope.get("route"), "path", "unmatched")
            self._observe(scope["method"], route, status, elapsed)
            if log.isEnabledFor(logging.INFO):
                extra = {"method": scope["method"], "route": route, "status": status, "ms": round(elapsed * 1000, 1)}
                log.info("request", extra=extra)
            request_id.reset(token)

    def _observe(self, method: str, route: str, status: int, elapsed: float) -> None:
        key = (method, route, status)
        child = self._latency.get(key)
        if child is None:
            child = metrics.HTTP_LATENCY.labels(method=method, route=route, status=str(status))
            if len(self._latency) < self.MAX_LATENCY_CHILDREN:
                self._latency[key] = child
        child.observe(elapsed)
