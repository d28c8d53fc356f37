"""The errors the simulated Hunyuan answers before any byte of a success, in TokenHub's error body: OpenAI's
`{"error": {"message", "type", "code"}}` plus `source` and `request_id` (TokenHub's error page, cloud.tencent.com
product 1823 doc 131595)."""

from __future__ import annotations

import uuid

from fastapi.responses import JSONResponse

_ERROR_KINDS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("authentication_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    500: ("server_error", "internal_error"),
    502: ("server_error", "bad_gateway"),
    503: ("server_error", "service_unavailable"),
    504: ("server_error", "timeout"),
}


class SimulatedAPIError(Exception):
    """An error the simulator answers with TokenHub's error body (before any byte of a success)."""

    def __init__(self, status_code: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type, default_code = _ERROR_KINDS.get(status_code, ("api_error", "error"))
        self.code = code or default_code

    def response(self) -> JSONResponse:
        body = {
            "error": {
                "message": self.message,
                "type": self.type,
                "code": self.code,
                "source": _source_of(self.status_code),
                "request_id": uuid.uuid4().hex,
            }
        }
        headers = {"Retry-After": "1"} if self.status_code in (429, 503) else None
        return JSONResponse(body, status_code=self.status_code, headers=headers)


def _source_of(status_code: int) -> str:
    """Who TokenHub blames: the request (4xx), its own gateway (rate limits) or the model's service (5xx)."""
    if status_code == 429:
        return "gateway"
    return "client" if status_code < 500 else "upstream"
