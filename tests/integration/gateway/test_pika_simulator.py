"""The Pika (fal queue) simulator over real HTTP: submit/status/result/cancel, signed webhooks, faults."""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

import httpx
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from simulators.pika import DEFAULT_MODEL_PATH
from tests.helpers.conditions import wait_until
from tests.helpers.pika_fixtures import ReceivedWebhook, RunningPikaSimulator, RunningWebhookReceiver

pytestmark = pytest.mark.slow

KEY = "sim-key"
AUTH = {"Authorization": f"Key {KEY}"}
BODY = {"prompt": "a cat surfing a wave", "resolution": "720p", "duration": 5}


def submit(sim: RunningPikaSimulator, webhook: str | None = None, path: str = DEFAULT_MODEL_PATH) -> dict[str, Any]:
    params = {"fal_webhook": webhook} if webhook else None
    response = httpx.post(f"{sim.base_url}/{path}", json=BODY, headers=AUTH, params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def wait_status(url: str, status: str, timeout: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = httpx.get(url, headers=AUTH).json()
        if body["status"] == status:
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.02)


def public_keys(sim: RunningPikaSimulator) -> dict[str, Ed25519PublicKey]:
    keys = httpx.get(sim.jwks_url).json()["keys"]
    result = {}
    for key in keys:
        assert key["kty"] == "OKP" and key["crv"] == "Ed25519"
        raw = base64.urlsafe_b64decode(key["x"] + "=" * (-len(key["x"]) % 4))
        assert len(raw) == 32
        result[key["kid"]] = Ed25519PublicKey.from_public_bytes(raw)
    return result


def verifies(sim: RunningPikaSimulator, webhook: ReceivedWebhook) -> bool:
    headers = webhook.headers
    message = "\n".join(
        [
            headers["x-fal-webhook-request-id"],
            headers["x-fal-webhook-user-id"],
            headers["x-fal-webhook-timestamp"],
            hashlib.sha256(webhook.body).hexdigest(),
        ]
    ).encode()
    signature = bytes.fromhex(headers["x-fal-webhook-signature"])
    for key in public_keys(sim).values():
        try:
            key.verify(signature, message)
        except InvalidSignature:
            continue
        return True
    return False


@pytest.fixture
def sim(pika_simulator: RunningPikaSimulator) -> RunningPikaSimulator:
    pika_simulator.config.api_key = KEY
    pika_simulator.config.job_seconds = 0.3
    return pika_simulator


def test_submit_status_result_shapes(sim: RunningPikaSimulator) -> None:
    sim.config.job_seconds = 1.0
    sim.config.queue_fraction = 0.5  # 0.5 s IN_QUEUE, then 0.5 s IN_PROGRESS
    submitted = submit(sim)
    request_id = submitted["request_id"]
    app = f"{sim.base_url}/fal-ai/pika/requests/{request_id}"
    assert submitted["status_url"] == f"{app}/status"
    assert submitted["response_url"] == app
    assert submitted["cancel_url"] == f"{app}/cancel"
    assert submitted["queue_position"] == 0
    assert httpx.get(submitted["status_url"], headers=AUTH).json()["status"] == "IN_QUEUE"
    assert httpx.get(submitted["status_url"], headers=AUTH).json()["queue_position"] == 0
    early = httpx.get(submitted["response_url"], headers=AUTH)
    assert early.status_code == 400 and "in progress" in early.json()["detail"]
    wait_status(submitted["status_url"], "IN_PROGRESS")
    wait_status(submitted["status_url"], "COMPLETED")
    result = httpx.get(submitted["response_url"], headers=AUTH)
    assert result.status_code == 200
    assert result.json()["video"]["url"].endswith(".mp4")
    cancel = httpx.put(submitted["cancel_url"], headers=AUTH)
    assert (cancel.status_code, cancel.json()) == (400, {"status": "ALREADY_COMPLETED"})
    assert sim.stats.submitted == 1 and sim.stats.result_reads == 2 and sim.stats.status_polls >= 4
    assert sim.stats.jobs_by_state["COMPLETED"] == 1 and sim.stats.last_request == BODY
    assert httpx.get(f"{sim.base_url}/fal-ai/pika/requests/nope/status", headers=AUTH).status_code == 404


def test_other_model_path_uses_its_app_id(sim: RunningPikaSimulator) -> None:
    submitted = submit(sim, path="fal-ai/pika/v2.2/image-to-video")
    assert submitted["status_url"].startswith(f"{sim.base_url}/fal-ai/pika/requests/")
    assert sim.stats.submitted_by_model["fal-ai/pika/v2.2/image-to-video"] == 1


def test_queue_position_counts_jobs_ahead(sim: RunningPikaSimulator) -> None:
    sim.config.job_seconds = 2.0
    sim.config.queue_fraction = 0.9
    positions = [submit(sim)["queue_position"] for _ in range(3)]
    assert positions == [0, 1, 2]


def test_cancel_before_completion(sim: RunningPikaSimulator, webhook_receiver: RunningWebhookReceiver) -> None:
    sim.config.job_seconds = 1.0
    submitted = submit(sim, webhook_receiver.url)
    cancel = httpx.put(submitted["cancel_url"], headers=AUTH)
    assert (cancel.status_code, cancel.json()) == (202, {"status": "CANCELLATION_REQUESTED"})
    assert httpx.get(submitted["status_url"], headers=AUTH).json()["status"] == "COMPLETED"
    assert httpx.get(submitted["response_url"], headers=AUTH).status_code == 400
    (webhook,) = webhook_receiver.wait_for(1)
    assert webhook.json()["status"] == "ERROR" and webhook.json()["payload"] is None
    assert sim.stats.cancels == 1 and sim.stats.jobs_by_state["CANCELLED"] == 1


def test_wrong_key_is_401(sim: RunningPikaSimulator) -> None:
    wrong = {"Authorization": "Key nope"}
    assert httpx.post(sim.submit_url, json=BODY, headers=wrong).status_code == 401
    assert httpx.post(sim.submit_url, json=BODY).status_code == 401
    submitted = submit(sim)
    assert httpx.get(submitted["status_url"], headers=wrong).status_code == 401
    assert sim.stats.submitted == 1 and sim.stats.unauthorized == 3


def test_missing_prompt_is_422(sim: RunningPikaSimulator) -> None:
    assert httpx.post(sim.submit_url, json={}, headers=AUTH).status_code == 422


def test_signed_webhook_verifies_against_jwks(
    sim: RunningPikaSimulator, webhook_receiver: RunningWebhookReceiver
) -> None:
    submitted = submit(sim, webhook_receiver.url)
    (webhook,) = webhook_receiver.wait_for(1)
    body = webhook.json()
    assert body == {
        "request_id": submitted["request_id"],
        "gateway_request_id": submitted["request_id"],
        "status": "OK",
        "payload": httpx.get(submitted["response_url"], headers=AUTH).json(),
        "error": None,
    }
    assert webhook.headers["x-fal-webhook-request-id"] == submitted["request_id"]
    assert webhook.headers["x-fal-webhook-user-id"] == sim.config.user_id
    assert abs(int(webhook.headers["x-fal-webhook-timestamp"]) - time.time()) < 5
    assert list(public_keys(sim)) == ["sim-1"]
    assert verifies(sim, webhook)
    tampered = ReceivedWebhook(webhook.body.replace(b'"OK"', b'"ER"'), webhook.headers, webhook.received_at)
    assert not verifies(sim, tampered)
    assert sim.stats.callbacks_sent == 1


def test_forged_and_stale_webhooks(sim: RunningPikaSimulator, webhook_receiver: RunningWebhookReceiver) -> None:
    sim.config.sign_with_wrong_key = True
    sim.config.stale_timestamp_seconds = -3600
    submit(sim, webhook_receiver.url)
    (webhook,) = webhook_receiver.wait_for(1)
    assert not verifies(sim, webhook)
    assert int(webhook.headers["x-fal-webhook-timestamp"]) < time.time() - 3000


def test_failure_ends_in_error(sim: RunningPikaSimulator, webhook_receiver: RunningWebhookReceiver) -> None:
    sim.config.fail_next = 1
    failed = submit(sim, webhook_receiver.url)
    ok = submit(sim, webhook_receiver.url)
    webhooks = {w.json()["request_id"]: w.json() for w in webhook_receiver.wait_for(2)}
    assert webhooks[failed["request_id"]]["status"] == "ERROR"
    assert webhooks[failed["request_id"]]["error"] == sim.config.error_message
    assert webhooks[ok["request_id"]]["status"] == "OK"
    assert httpx.get(failed["response_url"], headers=AUTH).status_code == 500
    assert sim.config.fail_next == 0 and sim.stats.jobs_by_state["FAILED"] == 1
    sim.config.failure_rate = 1.0
    submit(sim, webhook_receiver.url)
    assert webhook_receiver.wait_for(3)[-1].json()["status"] == "ERROR"


def test_callback_loss(sim: RunningPikaSimulator, webhook_receiver: RunningWebhookReceiver) -> None:
    sim.config.callback_loss_rate = 1.0
    submitted = submit(sim, webhook_receiver.url)
    wait_status(submitted["status_url"], "COMPLETED")
    wait_until(lambda: sim.stats.callbacks_lost == 1, what="the webhook dropped")
    assert webhook_receiver.received == []
    assert httpx.get(submitted["response_url"], headers=AUTH).status_code == 200  # polling still works


def test_duplicates_and_out_of_order(sim: RunningPikaSimulator, webhook_receiver: RunningWebhookReceiver) -> None:
    sim.config.duplicate_callbacks = True
    sim.config.out_of_order = True
    submit(sim, webhook_receiver.url)
    webhooks = webhook_receiver.wait_for(3)
    time.sleep(0.2)  # a quiet spell in which no fourth webhook may come (an absence has no signal to wait on)
    assert len(webhook_receiver.received) == 3
    assert webhooks[0].body == webhooks[1].body == webhooks[2].body
    stamps = [int(w.headers["x-fal-webhook-timestamp"]) for w in webhooks]
    assert stamps[0] == stamps[1] and stamps[2] == stamps[0] - sim.config.out_of_order_age_seconds
    assert all(verifies(sim, w) for w in webhooks)
    assert sim.stats.callbacks_sent == 3


def test_webhook_retries_then_gives_up(sim: RunningPikaSimulator, webhook_receiver: RunningWebhookReceiver) -> None:
    sim.config.callback_retry_seconds = 0.05
    webhook_receiver.fail_next = [500, 503]
    submit(sim, webhook_receiver.url)
    webhook_receiver.wait_for(1)
    assert len(webhook_receiver.rejected) == 2 and sim.stats.callback_attempts == 3
    webhook_receiver.fail_next = [500, 500, 500]
    submit(sim, webhook_receiver.url)
    deadline = time.monotonic() + 5
    while sim.stats.callbacks_failed == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert len(webhook_receiver.received) == 1 and sim.stats.callbacks_sent == 1


def test_callback_delay(sim: RunningPikaSimulator, webhook_receiver: RunningWebhookReceiver) -> None:
    sim.config.callback_delay_seconds = 0.5
    start = time.monotonic()
    submitted = submit(sim, webhook_receiver.url)
    wait_status(submitted["status_url"], "COMPLETED")
    assert webhook_receiver.received == []
    (webhook,) = webhook_receiver.wait_for(1)
    assert webhook.received_at - start >= 0.8
