"""The webhooks the simulated fal sends when a job ends: the body, the Ed25519 signature over it (or a forged one),
the JWKS that publishes the key, and delivery with retries, duplicates and stale copies on request."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from simulators.pika.jobs import COMPLETED, Job
from simulators.pika.stats import PikaSimulatorStats

JWKS_PATH = "/.well-known/jwks.json"
KEY_ID = "sim-1"


def webhook_message(request_id: str, user_id: str, timestamp: str, body: bytes) -> bytes:
    """The bytes fal signs for a webhook: request id, user id, timestamp and sha256 hex of the raw body."""
    return "\n".join([request_id, user_id, timestamp, hashlib.sha256(body).hexdigest()]).encode()


def public_jwk(public_key: Ed25519PublicKey, kid: str = KEY_ID) -> dict[str, str]:
    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid}


def webhook_body(job: Job) -> bytes:
    ok = job.state == COMPLETED
    body = {
        "request_id": job.request_id,
        "gateway_request_id": job.request_id,
        "status": "OK" if ok else "ERROR",
        "payload": job.result if ok else None,
        "error": None if ok else job.error,
    }
    if ok and job.config.payload_errors:  # the output stays readable at the response URL
        body["payload"] = None
        body["payload_error"] = "Response payload is not JSON serializable"
    return json.dumps(body, separators=(",", ":")).encode()


class WebhookSender:
    """Signs and delivers each ended job's webhook; `client` is open only while the app runs."""

    def __init__(self, stats: PikaSimulatorStats) -> None:
        self.stats = stats
        self.signing_key = Ed25519PrivateKey.generate()
        self.forged_key = Ed25519PrivateKey.generate()
        self.client: httpx.AsyncClient | None = None  # one pooled client for every webhook, opened at start

    def signed_headers(self, job: Job, body: bytes, timestamp: int) -> dict[str, str]:
        config = job.config
        key = self.forged_key if config.sign_with_wrong_key else self.signing_key
        stamp = str(timestamp)
        signature = key.sign(webhook_message(job.request_id, config.user_id, stamp, body)).hex()
        return {
            "Content-Type": "application/json",
            "X-Fal-Webhook-Request-Id": job.request_id,
            "X-Fal-Webhook-User-Id": config.user_id,
            "X-Fal-Webhook-Timestamp": stamp,
            "X-Fal-Webhook-Signature": signature,
        }

    async def deliver(self, job: Job) -> None:
        config = job.config
        if job.webhook_url is None:
            return
        if job.lose_callback:
            self.stats.callbacks_lost += 1
            return
        await asyncio.sleep(config.callback_delay_seconds)
        body = webhook_body(job)
        now = int(time.time()) + config.stale_timestamp_seconds
        copies = 2 if config.duplicate_callbacks else 1
        for _ in range(copies):
            await self.post(job, body, self.signed_headers(job, body, now))
        if config.out_of_order:
            old = now - config.out_of_order_age_seconds
            await self.post(job, body, self.signed_headers(job, body, old))

    async def post(self, job: Job, body: bytes, headers: dict[str, str]) -> None:
        assert job.webhook_url is not None
        assert self.client is not None, "webhooks are sent only while the app runs (its lifespan opens the client)"
        for attempt in range(max(job.config.callback_attempts, 1)):
            if attempt:
                await asyncio.sleep(job.config.callback_retry_seconds)
            self.stats.callback_attempts += 1
            try:
                response = await self.client.post(
                    job.webhook_url, content=body, headers=headers, timeout=job.config.callback_timeout_seconds
                )
            except httpx.HTTPError:
                continue
            if response.is_success:
                self.stats.callbacks_sent += 1
                return
        self.stats.callbacks_failed += 1
