"""Every error the gateway answers with, and the only place they become HTTP responses.

    GatewayError                      500 server_error
    ├── InvalidRequestError           400 invalid_request_error
    │   └── InputTooLongError         400 (truncate: false and a text above the model's max tokens)
    ├── AuthenticationError           401 authentication_error (+ WWW-Authenticate: Bearer)
    ├── PermissionDeniedError         403 permission_error (a key without the route's scope)
    ├── NotFoundError                 404 not_found_error
    ├── ConflictError                 409 conflict_error (e.g. an Idempotency-Key reused for another request)
    ├── PayloadTooLargeError          413 invalid_request_error
    ├── OverloadedError               429 rate_limit_error (+ Retry-After)
    │   ├── RateLimitExceededError    429 code rate_limit_exceeded (a key's or team's limit)
    │   └── InsufficientQuotaError    429 code insufficient_quota (a spent monthly budget)
    ├── ClientClosedRequestError      499 client_closed_request (nobody reads it: for logs and metrics)
    ├── UpstreamError                 502 upstream_error
    │   ├── UpstreamUnavailableError  503 service_unavailable
    │   └── UpstreamTimeoutError      504 timeout
    └── (each upstream module derives its own base from these, e.g. TritonUnavailableError)

Body shape (OpenAI): {"error": {"message", "type", "param", "code"}}.

A `GatewayError` becomes its answer in `error_response`: what routes raise reaches it through FastAPI's
exception handlers (`install_error_handlers`); the pure-ASGI middlewares (request limits, API keys) run outside
those handlers and answer with `send_error`, which gives the same answer and log line. gRPC maps the same
classes in `gateway.grpc.interceptors`.

Each error class's docstring has one form, which `python -m gateway.errors_doc` turns into docs/errors.md: its
first paragraph says when the error happens; a paragraph that begins `Do:` says what the client or the operator
should do. Further paragraphs are notes for this code's readers and are not published.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import SecretStr
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

log = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 1000


class GatewayError(Exception):
    """The base of every error class, never raised itself. An exception that is not a `GatewayError` (a bug) is
    answered 500 `server_error` too, with the message `internal error`.

    Do: client: retry once, then report the answer's `X-Request-Id`; operator: the log holds the traceback
    under that request id.
    """

    status_code: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    code: str | None = None  # a class's default; an instance may carry a more precise one (an upstream's)
    default_headers: ClassVar[Mapping[str, str]] = {}  # every answer of the class carries them

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        code: str | None = None,
        detail: str = "",
    ) -> None:
        """`message` is the client's; `detail` (a driver's exception, which may name hosts and paths) only
        the operator's: it is logged where the error is answered, and `str()` includes it."""
        message = encodable(shorten(message))
        super().__init__(f"{message}: {detail}" if detail else message)
        self.message = message
        self.detail = detail
        self.param = param
        self.headers = {**self.default_headers, **(headers or {})}
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


class InvalidRequestError(GatewayError):
    """The request is malformed or out of bounds: a missing or invalid field, a body that is not JSON, a value
    past a limit (`param` names the field where there is one); also an upstream's 400 or 422 for what the
    gateway passed on to it, with the upstream's own code.

    Do: fix the request as the message says; sent again unchanged, it fails again.
    """

    status_code = 400
    type = "invalid_request_error"


class InputTooLongError(InvalidRequestError):
    """An embeddings request sent `truncate: false` and a text longer than the model's maximum of tokens.

    Do: shorten or split the text, or send `truncate: true` to embed its first tokens only.
    """

    code = "context_length_exceeded"


class AuthenticationError(GatewayError):
    """The request has no API key, a malformed `Authorization` header, or a key that is unknown, revoked or
    expired. Every 401 carries `WWW-Authenticate: Bearer`.

    Do: send `Authorization: Bearer <key>` with a valid key; a revoked or expired key needs a new one (the
    message says which).
    """

    status_code = 401
    type = "authentication_error"
    code = "invalid_api_key"
    default_headers: ClassVar[Mapping[str, str]] = {"WWW-Authenticate": "Bearer"}


class PermissionDeniedError(GatewayError):
    """The API key lacks the scope of the route family it called (the admin API needs `admin`).

    Do: call with a key that has the scope, or have an admin create one.
    """

    status_code = 403
    type = "permission_error"
    code = "insufficient_permissions"


class NotFoundError(GatewayError):
    """What the request names does not exist: a model the gateway does not serve, a task that is unknown or
    past its retention (`TASKS_RETENTION_SECONDS` after it ended), an API key id, or what an upstream answered
    404 for (e.g. a chat model, with the upstream's code).

    Do: check the name or id; read a finished task before its retention passes.
    """

    status_code = 404
    type = "not_found_error"


class ConflictError(GatewayError):
    """The request conflicts with the state it would change: an `Idempotency-Key` reused for another request,
    a cancel of a task that has ended, a revoke of a key defined outside the admin API, a write to a collection
    being re-indexed (`collection_reindexing`) or holding vectors of another model revision
    (`collection_needs_reindex`), a re-index to a model of other dimensions (`dimensions_changed`).

    Do: as the message says: a new Idempotency-Key for a new request, wait for the re-index task, re-index
    the collection, create a new collection, or remove the key where it is defined.
    """

    status_code = 409
    type = "conflict_error"


class PayloadTooLargeError(GatewayError):
    """The request body is larger than `GATEWAY_MAX_BODY_BYTES` (by Content-Length before it is read, or
    counted while it is read), or a search call holds more documents or ids than one call takes.

    Do: send less per request: split the batch.
    """

    status_code = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class OverloadedError(GatewayError):
    """A limit of the gateway or of an upstream account was reached, and the request refused at once rather
    than queued: the pod's requests in flight (`GATEWAY_MAX_IN_FLIGHT`) or task watchers
    (`GATEWAY_MAX_TASK_WATCHERS`), the chat quota (`CHAT_*`) that would make it wait longer than allowed, or
    the upstream's own 429. Every 429 carries `Retry-After`.

    Do: client: retry after `Retry-After` seconds, with back-off; operator: lasting shedding needs more
    replicas (or a higher limit), quota refusals a larger upstream account (docs/operations.md, runbooks).
    """

    status_code = 429
    type = "rate_limit_error"
    code = "overloaded"

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)})


class RateLimitExceededError(OverloadedError):
    """The API key, or its team, is over one of its limits: requests per minute of the route family, chat
    tokens per minute, concurrent chat streams, or videos per day.

    Do: client: retry after `Retry-After` seconds and slow down; admin: raise the key's or the team's limits
    (`PUT /v1/admin/teams/{team}`, a new key, or the keys file).
    """

    code = "rate_limit_exceeded"


class InsufficientQuotaError(OverloadedError):
    """The monthly budget (tokens or cost) of the API key or its team is spent; `Retry-After` points at the
    start of next month (UTC).

    Do: admin: raise the budget; `GET /v1/usage?group_by=key` shows who spent it.
    """

    type = "insufficient_quota"
    code = "insufficient_quota"


class ClientClosedRequestError(GatewayError):
    """The client disconnected before its answer was ready, and the work was cancelled (nginx's 499): nobody
    reads this answer, it is for the logs and metrics.

    Do: nothing; many of them point at clients whose timeouts are shorter than the answers take.
    """

    status_code = 499
    type = "client_closed_request"


class UpstreamError(GatewayError):
    """An upstream failed in a way the client cannot fix: an error answer the gateway does not expect, an
    unreadable answer, or the gateway's credentials refused. Each upstream module raises its own subclass.

    Do: client: retry later; operator: the message names the upstream and its answer.
    """

    status_code = 502
    type = "upstream_error"


class UpstreamUnavailableError(UpstreamError):
    """A service the request needs does not answer: an upstream or a store (each has its subclass). Raised as
    itself for the usage store, a key store that is not configured, and a chat model whose circuit breaker is
    open (with `Retry-After`, after consecutive failures and no fallback model answered).

    Do: client: retry later (after `Retry-After` where given); operator: the message names the service
    (docs/operations.md, runbooks).
    """

    status_code = 503
    type = "service_unavailable"


class UpstreamTimeoutError(UpstreamError):
    """No answer in time: the request passed `GATEWAY_REQUEST_TIMEOUT_SECONDS` before its answer began (REST;
    gRPC: a unary call), and its work was cancelled; an upstream's subclass for one call to it. A stream that
    has begun is not cut.

    Do: client: retry, with less work per request; operator: find the slow part (Triton's queue time, the
    quota wait: `gateway_quota_wait_seconds`).
    """

    status_code = 504
    type = "timeout"


def shorten(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Messages may quote what the client sent (an unknown id, an upstream's answer): a long one is cut,
    so that an 8 KB id is not answered with 8 KB, nor break gRPC's limit on a status's details."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]}... ({len(message) - limit} more characters)"


def encodable(text: str) -> str:
    """`text` with what UTF-8 cannot encode (a lone surrogate quoted from the client's JSON) written as its escape
    (`\\ud800`): an error answer is encoded as UTF-8, and must not itself fail."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def without_secret(message: str, secret: SecretStr | None) -> str:
    """An upstream's message with our key replaced by ***, should the upstream echo it."""
    value = secret.get_secret_value() if secret is not None else ""
    return message.replace(value, "***") if value else message


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The OpenAI error shape; the message and param made `encodable`, whatever they quote."""
    param = encodable(param) if param is not None else None
    return {"error": {"message": encodable(message), "type": type_, "param": param, "code": code}}


async def _gateway_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    return error_response(exc, request.method, request.url.path)


def error_response(exc: GatewayError, method: str, path: str) -> JSONResponse:
    """The error's JSON answer with its status and headers; the detail kept from the client is logged."""
    if exc.detail:
        log.warning("%s %s answered %d: %s", method, path, exc.status_code, exc)
    return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers)


async def send_error(error: GatewayError, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer `error` from pure-ASGI middleware, which runs outside FastAPI's exception handlers: the answer
    and the log line they would give."""
    await error_response(error, scope["method"], scope["path"])(scope, receive, send)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    # `param` names the request field; positions in an unparsable body are not fields.
    param = location[0] if location and not location[0].isdigit() else None
    detail = str(first.get("msg", "invalid request"))
    message = f"{'.'.join(location)}: {detail}" if param else detail
    return JSONResponse(error_body(message, InvalidRequestError.type, param), status_code=400)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    type_ = NotFoundError.type if exc.status_code == 404 else InvalidRequestError.type
    if exc.status_code >= 500:
        type_ = GatewayError.type
    return JSONResponse(
        error_body(str(exc.detail), type_), status_code=exc.status_code, headers=getattr(exc, "headers", None)
    )


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error", exc_info=exc)
    return JSONResponse(error_body("internal error", GatewayError.type), status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(Exception, _unexpected_error)
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
