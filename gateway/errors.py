"""Every error the gateway answers with, and the only place they become HTTP responses.

    GatewayError                      500 server_error
    ├── InvalidRequestError           400 invalid_request_error
    │   └── InputTooLongError         400 (truncate: false and a text above the model's max tokens)
    ├── AuthenticationError           401 authentication_error
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
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import SecretStr
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 1000


class GatewayError(Exception):
    status_code: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    code: str | None = None  # a class's default; an instance may carry a more precise one (an upstream's)

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
        self.headers = headers or {}
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


class InvalidRequestError(GatewayError):
    status_code = 400
    type = "invalid_request_error"


class InputTooLongError(InvalidRequestError):
    code = "context_length_exceeded"


class AuthenticationError(GatewayError):
    status_code = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDeniedError(GatewayError):
    status_code = 403
    type = "permission_error"
    code = "insufficient_permissions"


class NotFoundError(GatewayError):
    status_code = 404
    type = "not_found_error"


class ConflictError(GatewayError):
    status_code = 409
    type = "conflict_error"


class PayloadTooLargeError(GatewayError):
    status_code = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class OverloadedError(GatewayError):
    status_code = 429
    type = "rate_limit_error"
    code = "overloaded"

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)})


class RateLimitExceededError(OverloadedError):
    code = "rate_limit_exceeded"


class InsufficientQuotaError(OverloadedError):
    type = "insufficient_quota"
    code = "insufficient_quota"


class ClientClosedRequestError(GatewayError):
    """The client disconnected before its answer was ready, and the work was cancelled (nginx's 499)."""

    status_code = 499
    type = "client_closed_request"


class UpstreamError(GatewayError):
    status_code = 502
    type = "upstream_error"


class UpstreamUnavailableError(UpstreamError):
    status_code = 503
    type = "service_unavailable"


class UpstreamTimeoutError(UpstreamError):
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
