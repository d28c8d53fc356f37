"""Verification of fal.ai webhook calls (Ed25519 signatures published as a JWKS).

fal signs the UTF-8 bytes of "\\n".join([request_id, user_id, timestamp, sha256_hex(body)]) and sends the
hex signature in `X-Fal-Webhook-Signature`. The public keys come from a JWKS document
(`{"keys": [{"kty": "OKP", "crv": "Ed25519", "x": <base64url 32 bytes>}, ...]}`), fetched over one pooled
`httpx.AsyncClient` and cached. A verification failure against a cache older than `ROTATION_MIN_AGE_SECONDS`
refetches once, so a rotated key is picked up; a failed fetch is an error, never a silent accept. When a refresh
of an expired cache fails, the keys fetched before stay in use (fal rotates rarely; its JWKS may be down for a
while), and a failed fetch is not tried again for `FAILED_FETCH_RETRY_SECONDS`, so calls (forged ones included)
cannot queue every webhook behind fetches of an endpoint that is down. The JWKS is read about once an hour,
so httpx serves it (the hot upstream calls use aiohttp). `httpx.HTTPError` never leaves this module.

The signature proves that fal sent a call, not that the job is ours: fal signs every webhook it sends, for
any customer's job and to any URL. So each job is submitted with its own webhook URL (`WebhookUrls`), which
carries a token minted and checked here. The token is checked first, locally: a call without it is refused
before its signature is looked at, so it never causes a JWKS fetch.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import time
from collections.abc import Callable, Mapping

import httpx
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import SecretStr

from gateway.errors import AuthenticationError, UpstreamUnavailableError

REQUEST_ID_HEADER = "x-fal-webhook-request-id"
USER_ID_HEADER = "x-fal-webhook-user-id"
TIMESTAMP_HEADER = "x-fal-webhook-timestamp"
SIGNATURE_HEADER = "x-fal-webhook-signature"
ROTATION_MIN_AGE_SECONDS = 300.0
FAILED_FETCH_RETRY_SECONDS = 30.0
JWKS_FETCH_TIMEOUT_SECONDS = 2.0  # the whole fetch; a webhook waits for it, and fal retries a 503
REFUSAL_LOG_INTERVAL_SECONDS = 60.0

log = logging.getLogger(__name__)


class WebhookSignatureError(AuthenticationError):
    """A call to the video webhook (`/v1/callbacks/...`) lacks its task's URL token, lacks fal's signature
    headers, is stale, or is signed by none of fal's published keys.

    Do: nothing for fal's own calls; operator: many of them mean forged calls, a wrong `GATEWAY_PUBLIC_URL`,
    or a rotated `VIDEO_API_KEY` (`gateway_video_callbacks_total`, results `bad_token` and `rejected`).
    """

    code = "invalid_signature"


class WebhookKeysUnavailableError(UpstreamUnavailableError):
    """fal's signing keys (the JWKS at `VIDEO_WEBHOOK_JWKS_URL`) could not be fetched and none are cached, so
    the webhook call cannot be verified.

    Do: nothing for clients: fal retries its webhook, and polling finishes the task anyway; operator: egress
    to the JWKS host.
    """

    code = "webhook_keys_unavailable"


class WebhookUrls:
    """The webhook URL each job is submitted with, and the check that a webhook came to one of them.

    The URL of attempt `n` of task `t` is `{base_url}/{t}?attempt=n&token=...`, the token an HMAC of both: a
    webhook that carries it came for a job this gateway submitted for that task, and names the attempt (so a
    job whose submit answer was lost in a crash is recognised when its webhook comes). The key is derived
    from the fal key, which every replica has, so no replica needs another secret (a new fal key voids the
    tokens of jobs in flight; polling finishes those). URLs without `attempt` (jobs submitted before attempts
    were numbered) carry the HMAC of the task id alone.
    """

    def __init__(self, base_url: str | None, fal_key: SecretStr | None) -> None:
        self._base_url = base_url.rstrip("/") if base_url else None  # None: no webhooks, tasks are polled
        secret = fal_key.get_secret_value() if fal_key is not None else ""
        self._key = hashlib.sha256(b"ai-gateway webhook url\0" + secret.encode()).digest()

    @property
    def enabled(self) -> bool:
        return self._base_url is not None

    def url(self, task_id: str, attempt: int) -> str | None:
        """The webhook URL to submit attempt `attempt` of `task_id`'s job with; None when webhooks are off."""
        if not self._base_url:
            return None
        return f"{self._base_url}/{task_id}?attempt={attempt}&token={self.token(task_id, attempt)}"

    def token(self, task_id: str, attempt: int | None = None) -> str:
        message = task_id if attempt is None else f"{task_id}#{attempt}"
        return hmac.new(self._key, message.encode(), hashlib.sha256).hexdigest()[:32]

    def verify(self, task_id: str, token: str, attempt: int | None = None) -> None:
        """Return when `token` is the one in the webhook URL of `task_id` (and `attempt`); raise
        `WebhookSignatureError` otherwise. Local and constant time: checked before anything else."""
        # Compared as bytes: a URL may carry any text, and `compare_digest` takes str only when it is ASCII.
        if not hmac.compare_digest(token.encode(), self.token(task_id, attempt).encode()):
            raise WebhookSignatureError("webhook URL lacks this task's token: not a job this gateway submitted")


class WebhookRefusals:
    """Webhooks refused for their URL token, logged at most once per `interval_seconds` with their count.

    Anyone can send them, so a line each would let anyone fill the log; the count still shows a misconfigured
    public URL (the metric counts each one)."""

    def __init__(
        self, interval_seconds: float = REFUSAL_LOG_INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval = interval_seconds
        self._clock = clock
        self._unlogged = 0
        self._logged_at = float("-inf")

    def refused(self) -> None:
        self._unlogged += 1
        now = self._clock()
        if now - self._logged_at >= self._interval:
            log.warning(
                "%d webhook(s) refused for a wrong or missing URL token (logged at most every %.0f s)",
                self._unlogged,
                self._interval,
            )
            self._unlogged, self._logged_at = 0, now


class FalWebhookVerifier:
    """Checks fal webhook signatures; use as an async context manager or call `aclose`."""

    def __init__(
        self,
        jwks_url: str,
        *,
        tolerance_seconds: float = 300.0,
        cache_seconds: float = 3600.0,
        timeout_seconds: float = JWKS_FETCH_TIMEOUT_SECONDS,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._jwks_url = jwks_url
        self._tolerance = tolerance_seconds
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._timeout = timeout_seconds
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_seconds), transport=transport)
        self._keys: list[Ed25519PublicKey] = []
        self._fetched_at: float | None = None
        self._failure: str | None = None  # why the last fetch failed, until `_retry_at`
        self._retry_at = float("-inf")
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> FalWebhookVerifier:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        """Return when the call is fal's and fresh; raise `WebhookSignatureError` otherwise."""
        lowered = {name.lower(): value for name, value in headers.items()}
        wanted = (REQUEST_ID_HEADER, USER_ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER)
        missing = [name for name in wanted if not lowered.get(name)]
        if missing:
            raise WebhookSignatureError(f"webhook lacks header(s) {', '.join(missing)}")
        request_id, user_id, timestamp, signature_hex = (lowered[name] for name in wanted)
        try:
            sent_at = int(timestamp.strip())
        except ValueError as exc:
            raise WebhookSignatureError(f"webhook timestamp {timestamp[:32]!r} is not Unix seconds") from exc
        skew = self._clock() - sent_at
        if abs(skew) > self._tolerance:
            raise WebhookSignatureError(
                f"webhook timestamp is {abs(skew):.0f}s {'old' if skew > 0 else 'in the future'}, "
                f"more than the {self._tolerance:.0f}s tolerated"
            )
        try:
            signature = bytes.fromhex(signature_hex.strip())
        except ValueError as exc:
            raise WebhookSignatureError("webhook signature is not hex") from exc
        message = "\n".join([request_id, user_id, timestamp, hashlib.sha256(body).hexdigest()]).encode("utf-8")

        keys = await self._current_keys()
        if _verifies(keys, signature, message):
            return
        # fal may have rotated its key since the cached JWKS was fetched: refetch once (not more often than
        # every ROTATION_MIN_AGE_SECONDS, so forged calls cannot make the gateway hammer the JWKS endpoint).
        refreshed = await self._current_keys(refresh=True)
        if refreshed is not keys and _verifies(refreshed, signature, message):
            return
        raise WebhookSignatureError("webhook signature matches none of fal's published keys")

    async def _current_keys(self, *, refresh: bool = False) -> list[Ed25519PublicKey]:
        async with self._lock:
            now = self._clock()
            # Another task may have refreshed while this one waited for the lock.
            stale = self._fetched_at is None or now - self._fetched_at >= self._cache_seconds
            rotated = refresh and self._fetched_at is not None and now - self._fetched_at >= ROTATION_MIN_AGE_SECONDS
            if stale or rotated:
                # Looking for a rotated key, the old ones are no answer: without the new JWKS, 503 (fal retries).
                await self._refresh(now, keep_old_keys=not rotated)
            return self._keys

    async def _refresh(self, now: float, *, keep_old_keys: bool) -> None:
        if now >= self._retry_at or self._failure is None:
            try:
                self._keys = await self._fetch()
                self._fetched_at, self._failure = now, None
                return
            except WebhookKeysUnavailableError as exc:
                self._failure, self._retry_at = exc.message, now + FAILED_FETCH_RETRY_SECONDS
                log.warning("%s; next try in %.0f s", exc.message, FAILED_FETCH_RETRY_SECONDS)
        if not (keep_old_keys and self._keys):
            raise WebhookKeysUnavailableError(self._failure or "fal webhook keys unavailable")

    async def _fetch(self) -> list[Ed25519PublicKey]:
        try:
            async with asyncio.timeout(self._timeout):  # for the whole fetch: httpx's timeouts are per phase
                response = await self._client.get(self._jwks_url)
            response.raise_for_status()
            document = response.json()
        except TimeoutError as exc:
            raise WebhookKeysUnavailableError(
                f"fal webhook keys unavailable: JWKS did not answer within {self._timeout:g} s"
            ) from exc
        except httpx.HTTPStatusError as exc:
            raise WebhookKeysUnavailableError(
                f"fal webhook keys unavailable: JWKS answered {exc.response.status_code}"
            ) from exc
        except httpx.HTTPError as exc:
            raise WebhookKeysUnavailableError(f"fal webhook keys unavailable: {type(exc).__name__}") from exc
        except ValueError as exc:
            raise WebhookKeysUnavailableError("fal webhook keys unavailable: JWKS is not JSON") from exc
        entries = document.get("keys") if isinstance(document, dict) else None
        if not isinstance(entries, list):
            raise WebhookKeysUnavailableError('fal webhook keys unavailable: JWKS has no "keys" list')
        keys = [key for key in (_public_key(entry) for entry in entries) if key is not None]
        if not keys:
            raise WebhookKeysUnavailableError(
                f"fal webhook keys unavailable: none of {len(entries)} JWKS entries is an Ed25519 key"
            )
        return keys


def _public_key(entry: object) -> Ed25519PublicKey | None:
    """An OKP/Ed25519 JWK as a key; anything else (other curves, malformed) is skipped."""
    if not isinstance(entry, dict) or entry.get("kty") != "OKP" or entry.get("crv") != "Ed25519":
        return None
    x = entry.get("x")
    if not isinstance(x, str):
        return None
    try:
        raw = base64.urlsafe_b64decode(x + "=" * (-len(x) % 4))
        return Ed25519PublicKey.from_public_bytes(raw)
    except (ValueError, binascii.Error):
        return None


def _verifies(keys: list[Ed25519PublicKey], signature: bytes, message: bytes) -> bool:
    for key in keys:
        try:
            key.verify(signature, message)
        except InvalidSignature:
            continue
        return True
    return False
