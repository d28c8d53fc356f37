"""Watch tokens: what a browser holds instead of an API key to watch one task over WebSocket.

A key that can spend money must not sit in a web page, and a browser cannot set an `Authorization` header on a
WebSocket. So the page's back end asks `POST /v1/tasks/{id}/token` with its key and hands the page the token, which
opens sockets for that one task, in the key's name, for a few minutes (`GATEWAY_WATCH_TOKEN_SECONDS`).

Format: `wt1.<claims>.<signature>`, where claims is base64url (unpadded) of "task_id\\nkey_id\\nexpires_at" (Unix
seconds) and the signature the first 32 bytes of HMAC-SHA256 over "wt1.<claims>", base64url. Only these
characters (letters, digits, `-`, `_`, `.`) occur, so the token travels as a `Sec-WebSocket-Protocol` value. It is
checked locally, in constant time: a forged or stale token costs no store read and no outbound call. The signing key
comes from `GATEWAY_WATCH_TOKEN_SECRET`, else from `VIDEO_API_KEY` (every replica has it, so a token minted on one
replica opens sockets on all). The key id in it lets the socket count against that key's watcher limit and die with
the key: a revoked key's tokens open nothing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import SecretStr

from gateway.errors import AuthenticationError, UpstreamUnavailableError
from gateway.keys.model import ApiKey

VERSION = "wt1"
SIGNATURE_BYTES = 32
SECRET_ENV = "GATEWAY_WATCH_TOKEN_SECRET"


class WatchTokenError(AuthenticationError):
    """A WebSocket offered a watch token (`Sec-WebSocket-Protocol: token.<token>`) that is malformed, was not
    signed by this gateway's key, has expired, or names another task than the socket's.

    Do: ask `POST /v1/tasks/{id}/token` for a new one (the page's back end does, with its API key); operator: every
    replica needs the same `GATEWAY_WATCH_TOKEN_SECRET` (or `VIDEO_API_KEY` where that is unset).
    """

    code = "invalid_watch_token"


class WatchTokensNotConfiguredError(UpstreamUnavailableError):
    """A watch token was asked for, or offered, while neither `GATEWAY_WATCH_TOKEN_SECRET` nor `VIDEO_API_KEY` is
    set, so there is no key to sign or check it with.

    Do: operator: set `GATEWAY_WATCH_TOKEN_SECRET` (the same on every replica), or `VIDEO_API_KEY`.
    """

    code = "watch_tokens_not_configured"


@dataclass(frozen=True)
class WatchToken:
    token: str
    task_id: str
    expires_at: int  # Unix seconds


@dataclass(frozen=True)
class WatchClaims:
    """What a valid token says: the task it opens sockets for, and the key it was minted with."""

    task_id: str
    key_id: str
    expires_at: int


class WatchTokens:
    def __init__(
        self, secret: SecretStr | None, lifetime_seconds: float, clock: Callable[[], float] = time.time
    ) -> None:
        if lifetime_seconds <= 0:
            raise ValueError("the watch token lifetime must be positive")
        value = secret.get_secret_value() if secret is not None else ""
        # A label of its own: the same secret signs other things (the webhook URLs derive theirs from the fal key).
        self._key = hashlib.sha256(b"ai-gateway watch token\0" + value.encode()).digest() if value else None
        self._lifetime = lifetime_seconds
        self._clock = clock

    @classmethod
    def from_secrets(cls, own: SecretStr | None, video_key: SecretStr | None, lifetime_seconds: float) -> WatchTokens:
        """Signed with GATEWAY_WATCH_TOKEN_SECRET, else with VIDEO_API_KEY."""
        return cls(own if own is not None and own.get_secret_value() else video_key, lifetime_seconds)

    def mint(self, task_id: str, key: ApiKey) -> WatchToken:
        expires_at = int(self._clock() + self._lifetime)
        claims = _encode(f"{task_id}\n{key.id}\n{expires_at}".encode())
        return WatchToken(f"{VERSION}.{claims}.{self._signature(claims)}", task_id, expires_at)

    def verify(self, token: str) -> WatchClaims:
        """The token's claims, or `WatchTokenError` (malformed, forged, expired). Never quotes the token."""
        version, _, rest = token.partition(".")
        claims, _, signature = rest.partition(".")
        if version != VERSION or not claims or not signature:
            raise WatchTokenError("malformed watch token: expected wt1.<claims>.<signature>")
        # Compared as bytes: the client's text may hold anything, and compare_digest takes str only when it is ASCII.
        if not hmac.compare_digest(signature.encode(), self._signature(claims).encode()):
            raise WatchTokenError("invalid watch token: not signed by this gateway")
        try:
            task_id, key_id, expires = _decode(claims).decode().split("\n")
            expires_at = int(expires)
        except (ValueError, binascii.Error, UnicodeDecodeError):
            raise WatchTokenError("malformed watch token: its claims do not parse") from None
        if self._clock() >= expires_at:
            raise WatchTokenError(f"watch token expired at {expires_at} (Unix seconds): ask for a new one")
        return WatchClaims(task_id, key_id, expires_at)

    def _signature(self, claims: str) -> str:
        if self._key is None:
            raise WatchTokensNotConfiguredError(f"watch tokens need a signing key: set {SECRET_ENV} or VIDEO_API_KEY")
        digest = hmac.new(self._key, f"{VERSION}.{claims}".encode(), hashlib.sha256).digest()
        return _encode(digest[:SIGNATURE_BYTES])


def _encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
