"""One translation of an upstream's HTTP error status into the gateway's errors, for every HTTP upstream.

Each upstream module parses its own error body (the vendors differ) and names its own error classes; the
status decides the class, the same way for all of them, and `Retry-After` is read in one place.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from gateway.errors import GatewayError, InvalidRequestError, NotFoundError, OverloadedError


def retry_after_seconds(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a `Retry-After` header: delta-seconds or an HTTP date (RFC 9110 10.2.3);
    None when it is absent or malformed."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


@dataclass(frozen=True)
class UpstreamErrors:
    """How one upstream's error statuses read to clients: its name in messages, the variable holding the key
    the gateway sends it, and its classes for a failed call (502) and an unavailable upstream (503)."""

    name: str
    key_variable: str
    failed: type[GatewayError]
    unavailable: type[GatewayError]
    not_found_param: str | None = None  # the request field a 404 points at (chat: the model)

    def of_status(self, status: int, message: str, retry_after: str | None, *, code: str | None = None) -> GatewayError:
        """The error for an upstream answer with `status` and the upstream's own (already redacted) `message`."""
        if status in (400, 422):
            return InvalidRequestError(f"{self.name} rejected the request ({status}): {message}", code=code)
        if status in (401, 403):
            return self.failed(f"{self.name} rejected the gateway's credentials ({status}; check {self.key_variable})")
        if status == 404:
            return NotFoundError(f"{self.name}: {message}", param=self.not_found_param, code=code)
        if status == 429:
            seconds = retry_after_seconds(retry_after)
            wait = 1 if seconds is None else max(1, math.ceil(seconds))
            return OverloadedError(f"{self.name} quota exceeded: {message}", retry_after=wait)
        if status in (502, 503, 504):
            return self.unavailable(f"{self.name} unavailable ({status}): {message}")
        return self.failed(f"{self.name} failed ({status}): {message}")
