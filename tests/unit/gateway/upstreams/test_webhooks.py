"""FalWebhookVerifier against a fake fal JWKS endpoint and freshly generated Ed25519 keys; the webhook URLs' tokens."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import SecretStr

from gateway.upstreams.webhooks import (
    FAILED_FETCH_RETRY_SECONDS,
    FalWebhookVerifier,
    WebhookKeysUnavailableError,
    WebhookRefusals,
    WebhookSignatureError,
    WebhookUrls,
)

JWKS_URL = "https://rest.alpha.fal.ai/.well-known/jwks.json"
NOW = 1_800_000_000.0
BODY = b'{"request_id":"req-1","status":"OK","payload":{"video":{"url":"https://v.fal.media/x.mp4"}}}'


def _jwk(key: Ed25519PrivateKey) -> dict[str, str]:
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return {"kty": "OKP", "crv": "Ed25519", "x": base64.urlsafe_b64encode(raw).rstrip(b"=").decode()}


def _headers(key: Ed25519PrivateKey, body: bytes = BODY, timestamp: float = NOW) -> dict[str, str]:
    ts = str(int(timestamp))
    message = "\n".join(["req-1", "user-9", ts, hashlib.sha256(body).hexdigest()]).encode()
    return {
        "X-Fal-Webhook-Request-Id": "req-1",
        "X-Fal-Webhook-User-Id": "user-9",
        "X-Fal-Webhook-Timestamp": ts,
        "X-Fal-Webhook-Signature": key.sign(message).hex(),
    }


class FakeFal:
    """A JWKS endpoint whose published keys and health the test changes; counts fetches."""

    def __init__(self, *keys: Ed25519PrivateKey) -> None:
        self.keys = list(keys)
        self.fetches = 0
        self.fail: Exception | int | None = None

    def handler(self, request: httpx.Request) -> httpx.Response:
        assert str(request.url) == JWKS_URL
        self.fetches += 1
        if isinstance(self.fail, Exception):
            raise self.fail
        if isinstance(self.fail, int):
            return httpx.Response(self.fail, text="down")
        return httpx.Response(
            200, json={"keys": [{"kty": "RSA", "n": "x", "e": "AQAB"}] + [_jwk(k) for k in self.keys]}
        )


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _verifier(fal: FakeFal, clock: Clock | None = None) -> FalWebhookVerifier:
    return FalWebhookVerifier(JWKS_URL, transport=httpx.MockTransport(fal.handler), clock=clock or Clock())


async def _verify(verifier: FalWebhookVerifier, *calls: tuple[dict[str, str], bytes]) -> None:
    async with verifier:
        for headers, body in calls:
            await verifier.verify(headers, body)


async def test_accepts_a_good_signature() -> None:
    key = Ed25519PrivateKey.generate()
    fal = FakeFal(Ed25519PrivateKey.generate(), key)  # the signing key need not be the first
    await _verify(_verifier(fal), (_headers(key), BODY))
    assert fal.fetches == 1


async def test_header_names_are_case_insensitive() -> None:
    key = Ed25519PrivateKey.generate()
    headers = {name.lower(): value for name, value in _headers(key).items()}
    headers = {name.upper() if "user" in name else name: value for name, value in headers.items()}
    await _verify(_verifier(FakeFal(key)), (headers, BODY))


async def test_accepts_httpx_headers() -> None:
    key = Ed25519PrivateKey.generate()
    await _verify(_verifier(FakeFal(key)), (httpx.Headers(_headers(key)), BODY))  # type: ignore[arg-type]


async def test_rejects_a_signature_by_another_key() -> None:
    fal = FakeFal(Ed25519PrivateKey.generate())
    with pytest.raises(WebhookSignatureError) as caught:
        await _verify(_verifier(fal), (_headers(Ed25519PrivateKey.generate()), BODY))
    assert caught.value.status_code == 401
    assert fal.fetches == 1  # a fresh cache is not refetched for a forged call


async def test_rejects_a_tampered_body() -> None:
    key = Ed25519PrivateKey.generate()
    with pytest.raises(WebhookSignatureError, match="none of"):
        await _verify(_verifier(FakeFal(key)), (_headers(key), BODY.replace(b"OK", b"KO")))


@pytest.mark.parametrize("field", ["Request-Id", "User-Id", "Timestamp"])
async def test_rejects_a_tampered_signed_header(field: str) -> None:
    key = Ed25519PrivateKey.generate()
    headers = _headers(key)
    name = f"X-Fal-Webhook-{field}"
    headers[name] = str(int(NOW) + 1) if field == "Timestamp" else headers[name] + "x"
    with pytest.raises(WebhookSignatureError):
        await _verify(_verifier(FakeFal(key)), (headers, BODY))


@pytest.mark.parametrize("missing", ["Request-Id", "User-Id", "Timestamp", "Signature"])
async def test_rejects_a_missing_header(missing: str) -> None:
    key = Ed25519PrivateKey.generate()
    fal = FakeFal(key)
    headers = _headers(key)
    del headers[f"X-Fal-Webhook-{missing}"]
    with pytest.raises(WebhookSignatureError, match=f"x-fal-webhook-{missing.lower()}"):
        await _verify(_verifier(fal), (headers, BODY))
    assert fal.fetches == 0


@pytest.mark.parametrize("offset", [-301.0, 301.0, -86_400.0, 86_400.0])
async def test_rejects_stale_and_future_timestamps(offset: float) -> None:
    key = Ed25519PrivateKey.generate()
    with pytest.raises(WebhookSignatureError, match="tolerated"):
        await _verify(_verifier(FakeFal(key)), (_headers(key, timestamp=NOW + offset), BODY))


@pytest.mark.parametrize("offset", [-299.0, 299.0])
async def test_accepts_timestamps_within_tolerance(offset: float) -> None:
    key = Ed25519PrivateKey.generate()
    await _verify(_verifier(FakeFal(key)), (_headers(key, timestamp=NOW + offset), BODY))


@pytest.mark.parametrize(("name", "value"), [("Timestamp", "yesterday"), ("Signature", "not-hex")])
async def test_rejects_malformed_values(name: str, value: str) -> None:
    key = Ed25519PrivateKey.generate()
    headers = {**_headers(key), f"X-Fal-Webhook-{name}": value}
    with pytest.raises(WebhookSignatureError):
        await _verify(_verifier(FakeFal(key)), (headers, BODY))


async def test_caches_the_jwks_across_many_verifies() -> None:
    key = Ed25519PrivateKey.generate()
    fal = FakeFal(key)
    clock = Clock()
    await _verify(_verifier(fal, clock), *[(_headers(key, timestamp=NOW), BODY) for _ in range(20)])
    assert fal.fetches == 1


async def test_refetches_after_cache_seconds() -> None:
    key = Ed25519PrivateKey.generate()
    fal = FakeFal(key)
    clock = Clock()
    verifier = _verifier(fal, clock)
    async with verifier:
        await verifier.verify(_headers(key), BODY)
        clock.now = NOW + 3601
        await verifier.verify(_headers(key, timestamp=clock.now), BODY)
    assert fal.fetches == 2


async def test_refetches_once_on_rotation() -> None:
    old, new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    fal = FakeFal(old)
    clock = Clock()
    verifier = _verifier(fal, clock)
    async with verifier:
        await verifier.verify(_headers(old), BODY)
        fal.keys = [new]  # fal rotates
        clock.now = NOW + 600  # the cached JWKS is older than 5 minutes, younger than cache_seconds
        await verifier.verify(_headers(new, timestamp=clock.now), BODY)
        assert fal.fetches == 2
        await verifier.verify(_headers(new, timestamp=clock.now), BODY)  # cached again
        with pytest.raises(WebhookSignatureError):  # forged: the just-fetched JWKS is not refetched
            await verifier.verify(_headers(old, timestamp=clock.now), BODY)
    assert fal.fetches == 2


async def test_no_refetch_for_a_young_cache() -> None:
    old, new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    fal = FakeFal(old)
    clock = Clock()
    verifier = _verifier(fal, clock)
    async with verifier:
        await verifier.verify(_headers(old), BODY)
        fal.keys = [new]
        clock.now = NOW + 60
        with pytest.raises(WebhookSignatureError):
            await verifier.verify(_headers(new, timestamp=clock.now), BODY)
    assert fal.fetches == 1


@pytest.mark.parametrize("failure", [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), 500, 404])
async def test_jwks_fetch_failure_is_503_never_an_accept(failure: Any) -> None:
    key = Ed25519PrivateKey.generate()
    fal = FakeFal(key)
    fal.fail = failure
    with pytest.raises(WebhookKeysUnavailableError) as caught:
        await _verify(_verifier(fal), (_headers(key), BODY))
    assert caught.value.status_code == 503


async def test_jwks_fetch_failure_on_rotation_is_503() -> None:
    key = Ed25519PrivateKey.generate()
    fal = FakeFal(key)
    clock = Clock()
    verifier = _verifier(fal, clock)
    async with verifier:
        await verifier.verify(_headers(key), BODY)
        fal.fail = 503
        clock.now = NOW + 600
        with pytest.raises(WebhookKeysUnavailableError):
            await verifier.verify(_headers(Ed25519PrivateKey.generate(), timestamp=clock.now), BODY)


@pytest.mark.parametrize(
    "document",
    [
        {"keys": []},
        {"keys": [{"kty": "OKP", "crv": "X25519", "x": "AAAA"}]},
        {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "too-short"}]},
        {"nokeys": True},
        ["not", "an", "object"],
    ],
)
async def test_jwks_without_usable_keys_is_503(document: Any) -> None:
    key = Ed25519PrivateKey.generate()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=document)

    verifier = FalWebhookVerifier(JWKS_URL, transport=httpx.MockTransport(handler), clock=Clock())
    with pytest.raises(WebhookKeysUnavailableError):
        await _verify(verifier, (_headers(key), BODY))


async def test_concurrent_verifies_fetch_once() -> None:
    key = Ed25519PrivateKey.generate()
    fal = FakeFal(key)
    verifier = _verifier(fal)
    async with verifier:
        await asyncio.gather(*(verifier.verify(_headers(key), BODY) for _ in range(10)))
    assert fal.fetches == 1


async def test_an_expired_cache_whose_refresh_fails_keeps_its_keys_and_retries_later() -> None:
    key = Ed25519PrivateKey.generate()
    fal = FakeFal(key)
    clock = Clock()
    verifier = _verifier(fal, clock)
    async with verifier:
        await verifier.verify(_headers(key), BODY)
        fal.fail = 503
        clock.now = NOW + 3601  # past cache_seconds
        await verifier.verify(_headers(key, timestamp=clock.now), BODY)  # the old key still verifies
        await verifier.verify(_headers(key, timestamp=clock.now), BODY)
        assert fal.fetches == 2  # one failed refresh; no new try within FAILED_FETCH_RETRY_SECONDS
        with pytest.raises(WebhookKeysUnavailableError):  # an unknown key: maybe rotated, cannot tell
            await verifier.verify(_headers(Ed25519PrivateKey.generate(), timestamp=clock.now), BODY)
        assert fal.fetches == 2
        fal.fail = None
        clock.now += FAILED_FETCH_RETRY_SECONDS
        await verifier.verify(_headers(key, timestamp=clock.now), BODY)
        assert fal.fetches == 3


async def test_without_keys_a_failed_fetch_is_not_repeated_for_every_call() -> None:
    key = Ed25519PrivateKey.generate()
    fal = FakeFal(key)
    fal.fail = httpx.ConnectError("refused")
    clock = Clock()
    verifier = _verifier(fal, clock)
    async with verifier:
        for _ in range(5):
            with pytest.raises(WebhookKeysUnavailableError, match="ConnectError"):
                await verifier.verify(_headers(key), BODY)
        assert fal.fetches == 1
        fal.fail = None
        clock.now += FAILED_FETCH_RETRY_SECONDS
        await verifier.verify(_headers(key, timestamp=clock.now), BODY)
        assert fal.fetches == 2


def test_each_task_attempt_has_its_own_webhook_url_token_under_a_key_derived_from_the_fal_key() -> None:
    base = "https://gw.example/v1/callbacks/video"
    replicas = [WebhookUrls(base, SecretStr(key)) for key in ("k1", "k1", "k2")]
    url = replicas[0].url("task-1", 2)
    assert url is not None and url.startswith(f"{base}/task-1?attempt=2&token=")
    token = url.partition("&token=")[2]
    assert replicas[1].url("task-1", 2) == url  # every replica with the key agrees
    replicas[1].verify("task-1", token, 2)
    refused = [
        ("task-2", token, 2, 1),  # another task
        ("task-1", token, 1, 1),  # another attempt
        ("task-1", token, None, 1),  # the attempt left out
        ("task-1", token, 2, 2),  # another key (a new fal key)
        ("task-1", "", 2, 1),  # no token
        ("task-1", "é" * 32, 2, 1),  # any text
    ]
    for task_id, candidate, attempt, replica in refused:
        with pytest.raises(WebhookSignatureError, match="lacks this task's token"):
            replicas[replica].verify(task_id, candidate, attempt)
    replicas[0].verify("task-1", replicas[0].token("task-1"))  # a URL minted before attempts were numbered
    assert WebhookUrls(None, SecretStr("k1")).url("task-1", 1) is None  # no public URL: polled from the start


def test_token_refusals_are_logged_at_most_once_per_interval_with_their_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock(0.0)
    refusals = WebhookRefusals(interval_seconds=60.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="gateway.upstreams.webhooks"):
        for second in range(0, 150):  # ten a second for 150 s
            clock.now = float(second)
            for _ in range(10):
                refusals.refused()
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3, lines  # at 0 s, 60 s and 120 s
    assert [line.split()[0] for line in lines] == ["1", "600", "600"]


async def test_a_jwks_host_that_accepts_and_never_answers_holds_a_webhook_no_longer_than_the_deadline() -> None:
    """A real socket that accepts connections and never answers (httpx's per-phase timeouts would allow more)."""
    key = Ed25519PrivateKey.generate()
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    verifier = FalWebhookVerifier(f"http://127.0.0.1:{port}/jwks", timeout_seconds=0.3, clock=Clock())
    started = asyncio.get_running_loop().time()
    async with verifier:
        with pytest.raises(WebhookKeysUnavailableError, match=r"did not answer within 0\.3 s"):
            await verifier.verify(_headers(key), BODY)
    held = asyncio.get_running_loop().time() - started
    assert accepted, "the JWKS host was never reached"
    for writer in accepted:
        writer.close()
    server.close()
    await server.wait_closed()
    assert held < 2.0  # the deadline (0.3 s), not httpx's per-phase timeouts
