"""Video tasks end to end: a real gateway (SQLite task store) in front of the Pika (fal queue) simulator.

The simulator signs its webhooks with its own Ed25519 key and publishes it as JWKS; the gateway verifies
them with the real `FalWebhookVerifier`. No Triton is needed: the gateway points at a closed port.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
import httpx
import pytest
from pydantic import SecretStr

from gateway.grpc.pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.settings import (
    AuthSettings,
    LimitSettings,
    RedisSettings,
    ServerSettings,
    TaskStoreSettings,
    VideoSettings,
)
from gateway.upstreams.webhooks import WebhookUrls
from localtriton.ports import free_port
from simulators.pika import webhook_message
from tests.helpers.conditions import wait_until
from tests.helpers.metrics import metric
from tests.helpers.pika_fixtures import RunningPikaSimulator
from tests.helpers.redis_fixtures import RedisServer
from tests.helpers.running_gateway import RunningGateway, scratch_dir

pytestmark = pytest.mark.slow

KEY = "fal-key-secret"
NO_TRITON = "127.0.0.1:9"  # video tasks do not need Triton


def start_image_gateway(
    factory: Callable[..., RunningGateway],
    simulator: RunningPikaSimulator,
    *,
    public: bool = True,
    tasks: dict[str, Any] | None = None,
    limits: LimitSettings | None = None,
    **image_overrides: Any,
) -> RunningGateway:
    simulator.config.api_key = KEY
    port = free_port()
    server = ServerSettings(
        host="127.0.0.1",
        http_port=port,
        grpc_port=free_port(),
        public_url=f"http://127.0.0.1:{port}" if public else None,
    )
    images: dict[str, Any] = {
        "base_url": simulator.base_url,
        "api_key": SecretStr(KEY),
        "webhook_jwks_url": simulator.jwks_url,
        "platform_url": simulator.base_url,
        "poll_initial_seconds": 0.1,
        "poll_max_seconds": 0.5,
        **image_overrides,
    }
    store = {"scan_interval_seconds": 0.05, "lease_seconds": 5.0, **(tasks or {})}
    if "sqlite_path" not in store:
        store["sqlite_path"] = str(scratch_dir("image-tasks-") / "tasks.sqlite3")
    concerns: dict[str, Any] = {"limits": limits} if limits else {}
    return factory(
        NO_TRITON, server=server, video=VideoSettings(**images), tasks=TaskStoreSettings(**store), **concerns
    )


@pytest.fixture
def image_gateway(
    pika_simulator: RunningPikaSimulator, gateway_factory: Callable[..., RunningGateway]
) -> RunningGateway:
    return start_image_gateway(gateway_factory, pika_simulator)


def submit(
    http: httpx.Client, gateway: RunningGateway, body: dict[str, Any] | None = None, **kwargs: Any
) -> httpx.Response:
    return http.post(
        f"{gateway.base_url}/v1/images/generations", json=body or {"prompt": "a red fox in snow"}, **kwargs
    )


def wait_until_done(http: httpx.Client, gateway: RunningGateway, task_id: str, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        task = http.get(f"{gateway.base_url}/v1/tasks/{task_id}").json()
        if task["status"] in ("completed", "failed", "cancelled"):
            return task
        assert time.monotonic() < deadline, f"task still {task['status']} after {timeout} s"
        time.sleep(0.05)


def signed_webhook(
    simulator: RunningPikaSimulator, request_id: str, body: dict[str, Any], *, timestamp: int | None = None
) -> tuple[bytes, dict[str, str]]:
    raw = json.dumps(body).encode()
    stamp = str(timestamp if timestamp is not None else int(time.time()))
    signature = simulator.app.state.signing_key.sign(webhook_message(request_id, "sim-user", stamp, raw)).hex()
    headers = {
        "Content-Type": "application/json",
        "X-Fal-Webhook-Request-Id": request_id,
        "X-Fal-Webhook-User-Id": "sim-user",
        "X-Fal-Webhook-Timestamp": stamp,
        "X-Fal-Webhook-Signature": signature,
    }
    return raw, headers


def test_submit_answers_202_before_the_upstream_is_called_and_the_webhook_completes_the_task(
    image_gateway: RunningGateway, pika_simulator: RunningPikaSimulator, http: httpx.Client
) -> None:
    pika_simulator.config.submit_delay_seconds = 1.0  # a slow upstream must not slow the answer
    # The gateways run in the test process and share its metrics: counted from here, not from earlier tests.
    applied = metric(http, image_gateway.base_url, "gateway_video_callbacks_total", result="applied")
    started = time.monotonic()
    answer = submit(http, image_gateway, {"prompt": "a red fox in snow", "width": 1280, "height": 720, "seed": 7})
    elapsed = time.monotonic() - started
    assert answer.status_code == 202, answer.text
    assert elapsed < 0.5 and pika_simulator.stats.submitted == 0
    task = answer.json()
    assert task["status"] == "pending" and task["object"] == "image.generation.task"
    assert answer.headers["location"] == f"/v1/tasks/{task['id']}"
    done = wait_until_done(http, image_gateway, task["id"])
    assert done["status"] == "completed" and done["error"] is None
    assert done["urls"] == [done["result"]["video"]["url"]] and done["completed_at"] >= done["created_at"]
    sent = pika_simulator.stats.last_request
    assert sent == {"prompt": "a red fox in snow", "aspect_ratio": "16:9", "resolution": "720p", "seed": 7}
    assert pika_simulator.stats.last_headers["authorization"] == f"Key {KEY}"
    assert pika_simulator.stats.status_polls == 0  # the webhook came: no polling
    assert metric(http, image_gateway.base_url, "gateway_video_callbacks_total", result="applied") == applied + 1


def test_every_callback_lost_the_task_completes_by_polling(
    pika_simulator: RunningPikaSimulator, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    pika_simulator.config.callback_loss_rate = 1.0
    pika_simulator.config.status_failure_rate = 0.3  # a flaky status endpoint only delays the outcome
    gateway = start_image_gateway(gateway_factory, pika_simulator, callback_grace_seconds=0.2)
    before = metric(http, gateway.base_url, "gateway_video_tasks_completed_by_polling_total")
    ids = [submit(http, gateway, {"prompt": f"scene {i}"}).json()["id"] for i in range(3)]
    for task_id in ids:
        assert wait_until_done(http, gateway, task_id)["status"] == "completed"
    assert pika_simulator.stats.callbacks_lost == 3 and pika_simulator.stats.status_polls >= 3
    assert metric(http, gateway.base_url, "gateway_video_tasks_completed_by_polling_total") == before + 3


def test_an_ok_webhook_without_its_payload_has_the_result_fetched_at_once(
    image_gateway: RunningGateway, pika_simulator: RunningPikaSimulator, http: httpx.Client
) -> None:
    """fal sends `"payload": null` and a `payload_error` when it could not attach the output: the task is
    polled then (well before its webhook grace time), not completed with an empty result."""
    pika_simulator.config.payload_errors = True
    before = metric(http, image_gateway.base_url, "gateway_video_tasks_completed_by_polling_total")
    done = wait_until_done(http, image_gateway, submit(http, image_gateway).json()["id"], timeout=10.0)
    assert done["status"] == "completed" and done["urls"] == [done["result"]["video"]["url"]]
    assert pika_simulator.stats.callbacks_sent == 1 and pika_simulator.stats.status_polls >= 1
    assert metric(http, image_gateway.base_url, "gateway_video_tasks_completed_by_polling_total") == before + 1


def test_without_a_public_url_tasks_are_polled_from_the_start(
    pika_simulator: RunningPikaSimulator, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = start_image_gateway(gateway_factory, pika_simulator, public=False)
    task_id = submit(http, gateway).json()["id"]
    assert wait_until_done(http, gateway, task_id)["status"] == "completed"
    assert pika_simulator.stats.callbacks_sent == 0 and pika_simulator.stats.status_polls >= 1


def test_upstream_failure_reported_by_webhook_fails_the_task_with_its_message(
    image_gateway: RunningGateway, pika_simulator: RunningPikaSimulator, http: httpx.Client
) -> None:
    pika_simulator.config.fail_next = 1
    done = wait_until_done(http, image_gateway, submit(http, image_gateway).json()["id"])
    assert done["status"] == "failed" and done["result"] is None
    assert done["error"] == {"code": "upstream_error", "message": "Simulated Pika generation failure"}


def test_duplicate_and_out_of_order_callbacks_leave_the_right_final_state(
    image_gateway: RunningGateway, pika_simulator: RunningPikaSimulator, http: httpx.Client
) -> None:
    pika_simulator.config.duplicate_callbacks = True
    pika_simulator.config.out_of_order = True
    duplicates = metric(http, image_gateway.base_url, "gateway_video_callbacks_total", result="duplicate")
    task_id = submit(http, image_gateway).json()["id"]
    done = wait_until_done(http, image_gateway, task_id)
    assert done["status"] == "completed"
    deadline = time.monotonic() + 5
    while pika_simulator.stats.callbacks_sent < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pika_simulator.stats.callbacks_sent == 3  # the original, its duplicate and a stale copy: all 2xx
    # A late ERROR for the same job (fal retries for hours; order is not guaranteed) changes nothing.
    request_id = next(iter(pika_simulator.stats.polls_by_request), None) or _request_id(pika_simulator)
    raw, headers = signed_webhook(
        pika_simulator, request_id, {"request_id": request_id, "status": "ERROR", "error": "late"}
    )
    late = http.post(webhook_url(pika_simulator, request_id), content=raw, headers=headers)
    assert late.status_code == 200 and late.json()["status"] == "completed"
    assert http.get(f"{image_gateway.base_url}/v1/tasks/{task_id}").json() == done
    assert metric(http, image_gateway.base_url, "gateway_video_callbacks_total", result="duplicate") >= duplicates + 3


def _request_id(simulator: RunningPikaSimulator) -> str:
    jobs = simulator.app.state.simulator.jobs
    assert len(jobs) == 1
    return str(next(iter(jobs)))


def webhook_url(simulator: RunningPikaSimulator, request_id: str) -> str:
    """The webhook URL the gateway submitted the job `request_id` with (its task's token included)."""
    url: str = simulator.app.state.simulator.jobs[request_id].webhook_url
    return url


def test_forged_stale_or_unsigned_webhooks_get_401_and_change_nothing(
    image_gateway: RunningGateway,
    pika_simulator: RunningPikaSimulator,
    http: httpx.Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.services.video")
    caplog.set_level(logging.WARNING, logger="gateway.upstreams.webhooks")
    pika_simulator.config.sign_with_wrong_key = True
    pika_simulator.config.job_seconds = 0.2
    task_id = submit(http, image_gateway).json()["id"]
    deadline = time.monotonic() + 10
    while pika_simulator.stats.callbacks_failed < 1:  # every attempt was refused
        assert time.monotonic() < deadline
        time.sleep(0.05)
    task = http.get(f"{image_gateway.base_url}/v1/tasks/{task_id}").json()
    assert task["status"] == "processing"
    request_id = _request_id(pika_simulator)
    url = webhook_url(pika_simulator, request_id)
    assert url.startswith(f"{image_gateway.base_url}/v1/callbacks/video/{task_id}?attempt=1&token=")
    ok = {"request_id": request_id, "status": "OK", "payload": {"video": {"url": "https://example.com/x.mp4"}}}
    stale_raw, stale_headers = signed_webhook(pika_simulator, request_id, ok, timestamp=int(time.time()) - 600)
    stale = http.post(url, content=stale_raw, headers=stale_headers)
    assert stale.status_code == 401 and stale.json()["error"]["code"] == "invalid_signature"
    raw, headers = signed_webhook(pika_simulator, request_id, ok)
    tampered = http.post(url, content=raw.replace(b"x.mp4", b"y.mp4"), headers=headers)
    assert tampered.status_code == 401
    unsigned = http.post(url, content=raw, headers={"Content-Type": "application/json"})
    assert unsigned.status_code == 401 and "x-fal-webhook-signature" in unsigned.json()["error"]["message"]
    # Signed by fal, but not to the URL this gateway gave the job: e.g. another fal customer's job
    # submitted with this task's callback address.
    plain = f"{image_gateway.base_url}/v1/callbacks/video/{task_id}"
    another_tasks = WebhookUrls(None, SecretStr(KEY)).token("task_other", 1)
    bad_tokens = metric(http, image_gateway.base_url, "gateway_video_callbacks_total", result="bad_token")
    untokened_urls = (plain, f"{plain}?attempt=1&token={'0' * 32}", f"{plain}?attempt=1&token={another_tasks}")
    for untokened in untokened_urls:
        refused = http.post(untokened, content=raw, headers=headers)
        assert refused.status_code == 401 and "token" in refused.json()["error"]["message"], refused.text
    assert http.get(f"{image_gateway.base_url}/v1/tasks/{task_id}").json()["status"] == "processing"
    refusals = [r.getMessage() for r in caplog.records if r.name == "gateway.services.video.service"]
    assert any(f"task {task_id} refused: webhook signature matches none" in m for m in refusals), refusals
    assert any("lacks header(s)" in m and "x-fal-webhook-signature" in m for m in refusals)
    # Token refusals (anyone can send them) are counted, and logged once a minute with their count.
    assert not any("token" in m for m in refusals), refusals
    token_lines = [r.getMessage() for r in caplog.records if r.name == "gateway.upstreams.webhooks"]
    assert len(token_lines) == 1 and "refused for a wrong or missing URL token" in token_lines[0], token_lines
    assert metric(http, image_gateway.base_url, "gateway_video_callbacks_total", result="bad_token") == bad_tokens + 3
    assert not any(another_tasks in m or "0" * 32 in m for m in refusals + token_lines)  # tokens are not logged
    unknown_url = f"{image_gateway.base_url}/v1/callbacks/video/task_unknown"
    unknown_token = WebhookUrls(None, SecretStr(KEY)).token("task_unknown", 1)
    unknown = http.post(f"{unknown_url}?attempt=1&token={unknown_token}", content=raw, headers=headers)
    assert unknown.status_code == 404
    accepted = http.post(url, content=raw, headers=headers)  # the genuine article is applied
    assert accepted.status_code == 200 and accepted.json()["status"] == "completed"
    assert http.get(f"{image_gateway.base_url}/v1/tasks/{task_id}").json()["urls"] == ["https://example.com/x.mp4"]


def test_a_task_past_its_timeout_fails_with_reason_timeout_and_the_job_is_cancelled(
    pika_simulator: RunningPikaSimulator, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    pika_simulator.config.job_seconds = 30
    gateway = start_image_gateway(gateway_factory, pika_simulator, task_timeout_seconds=1.0)
    done = wait_until_done(http, gateway, submit(http, gateway).json()["id"])
    assert done["status"] == "failed" and done["error"]["code"] == "timeout"
    deadline = time.monotonic() + 5
    while pika_simulator.stats.cancels < 1:
        assert time.monotonic() < deadline, "the upstream job was not cancelled"
        time.sleep(0.05)


def test_cancel_moves_a_running_task_to_cancelled_once_and_a_finished_one_answers_409(
    image_gateway: RunningGateway, pika_simulator: RunningPikaSimulator, http: httpx.Client
) -> None:
    pika_simulator.config.job_seconds = 30
    task_id = submit(http, image_gateway).json()["id"]
    deadline = time.monotonic() + 5
    while http.get(f"{image_gateway.base_url}/v1/tasks/{task_id}").json()["status"] != "processing":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    cancelled = http.delete(f"{image_gateway.base_url}/v1/tasks/{task_id}")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["error"]["code"] == "cancelled"
    again = http.delete(f"{image_gateway.base_url}/v1/tasks/{task_id}")
    assert again.status_code == 200 and again.json() == cancelled.json()
    while pika_simulator.stats.cancels < 1:
        assert time.monotonic() < deadline + 5
        time.sleep(0.05)
    pika_simulator.config.job_seconds = 0.1
    finished = wait_until_done(http, image_gateway, submit(http, image_gateway).json()["id"])
    refused = http.delete(f"{image_gateway.base_url}/v1/tasks/{finished['id']}")
    assert refused.status_code == 409 and refused.json()["error"]["type"] == "conflict_error"
    assert http.delete(f"{image_gateway.base_url}/v1/tasks/task_missing").status_code == 404


def test_idempotency_key_returns_the_same_task_and_refuses_another_body(
    pika_simulator: RunningPikaSimulator, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = start_image_gateway(gateway_factory, pika_simulator)
    key = {"Idempotency-Key": "order-42"}
    first = submit(http, gateway, {"prompt": "a lighthouse"}, headers=key)
    second = submit(http, gateway, {"prompt": "a lighthouse"}, headers=key)
    assert first.status_code == second.status_code == 202
    assert second.json()["id"] == first.json()["id"] and second.headers["idempotent-replayed"] == "true"
    other = submit(http, gateway, {"prompt": "a windmill"}, headers=key)
    assert other.status_code == 409 and other.json()["error"]["param"] == "Idempotency-Key"
    wait_until_done(http, gateway, first.json()["id"])
    assert pika_simulator.stats.submitted == 1


def test_idempotency_keys_are_scoped_to_the_caller_and_webhooks_need_no_api_key(
    pika_simulator: RunningPikaSimulator, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = start_image_gateway(gateway_factory, pika_simulator)
    gateway.stop()
    keyed = gateway_factory(
        NO_TRITON,
        server=gateway.settings.server,
        video=gateway.settings.video,
        tasks=gateway.settings.tasks,
        auth=AuthSettings(api_keys=SecretStr("alice-key,bob-key")),
    )
    body = {"prompt": "a harbour at dawn"}
    alice = submit(http, keyed, body, headers={"Idempotency-Key": "k1", "Authorization": "Bearer alice-key"})
    bob = submit(http, keyed, body, headers={"Idempotency-Key": "k1", "Authorization": "Bearer bob-key"})
    assert alice.status_code == bob.status_code == 202 and alice.json()["id"] != bob.json()["id"]
    # The same key however the header is spelled: the same caller, the same task.
    again = submit(http, keyed, body, headers={"Idempotency-Key": "k1", "Authorization": "bearer  alice-key"})
    assert again.status_code == 202 and again.json()["id"] == alice.json()["id"]
    assert submit(http, keyed, body).status_code == 401
    headers = {"Authorization": "Bearer alice-key"}
    for task in (alice.json(), bob.json()):  # completed by webhooks, which carry no API key
        deadline = time.monotonic() + 10
        while http.get(f"{keyed.base_url}/v1/tasks/{task['id']}", headers=headers).json()["status"] != "completed":
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert pika_simulator.stats.callbacks_sent == 2


def test_finished_tasks_expire_after_the_retention(
    pika_simulator: RunningPikaSimulator, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = start_image_gateway(gateway_factory, pika_simulator, tasks={"retention_seconds": 1.0})
    done = wait_until_done(http, gateway, submit(http, gateway).json()["id"])
    assert done["expires_at"] is not None and done["expires_at"] - done["completed_at"] <= 1
    time.sleep(1.2)  # past the retention (1 s), whose length is what is tested
    gone = http.get(f"{gateway.base_url}/v1/tasks/{done['id']}")
    assert gone.status_code == 404 and gone.json()["error"]["type"] == "not_found_error"


def test_events_stream_every_state_and_end_with_done(
    image_gateway: RunningGateway, pika_simulator: RunningPikaSimulator, http: httpx.Client
) -> None:
    pika_simulator.config.job_seconds = 0.6
    task_id = submit(http, image_gateway).json()["id"]
    statuses: list[str] = []
    with http.stream("GET", f"{image_gateway.base_url}/v1/tasks/{task_id}/events") as stream:
        assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        payloads = [line[len("data: ") :] for line in stream.iter_lines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    statuses = [json.loads(payload)["status"] for payload in payloads[:-1]]
    assert statuses[-1] == "completed" and "processing" in statuses
    assert statuses == sorted(statuses, key=["pending", "processing", "completed"].index)
    assert len(statuses) == len(set(statuses))  # bookkeeping writes are not shown as changes
    missing = http.get(f"{image_gateway.base_url}/v1/tasks/task_nope/events")
    assert missing.status_code == 404


def test_task_watchers_have_their_own_budget_apart_from_the_requests_in_flight(
    pika_simulator: RunningPikaSimulator, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    pika_simulator.config.job_seconds = 10.0
    limits = LimitSettings(max_in_flight=1, max_task_watchers=2)
    gateway = start_image_gateway(gateway_factory, pika_simulator, limits=limits)
    task_id = submit(http, gateway).json()["id"]
    url = f"{gateway.base_url}/v1/tasks/{task_id}/events"
    with (
        httpx.Client(timeout=30) as one,
        httpx.Client(timeout=30) as two,
        one.stream("GET", url) as first,
        two.stream("GET", url) as second,
    ):
        assert first.status_code == second.status_code == 200  # two watchers, with one request permit
        third = http.get(url)
        assert third.status_code == 429 and "2 task watchers" in third.json()["error"]["message"]
        with grpc.insecure_channel(gateway.grpc_target) as channel, pytest.raises(grpc.RpcError) as refused:
            list(gateway_pb2_grpc.ImagesStub(channel).WatchTask(gateway_pb2.TaskRequest(task_id=task_id), timeout=5))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert http.get(f"{gateway.base_url}/v1/tasks/{task_id}").status_code == 200  # the request permit is free
        metrics = http.get(f"{gateway.base_url}/metrics").text
        assert "gateway_task_watchers 2.0" in metrics and "http_requests_in_flight 0.0" in metrics
    deadline = time.monotonic() + 10
    while "gateway_task_watchers 0.0" not in http.get(f"{gateway.base_url}/metrics").text:
        assert time.monotonic() < deadline, "closed event streams kept their permits"
        time.sleep(0.1)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "   "}, "prompt"),
        ({"prompt": "x" * 2001}, "prompt"),
        ({"prompt": "ok", "negative_prompt": "n" * 2001}, "negative_prompt"),
        ({"prompt": "ok", "width": 100, "height": 720}, "width"),
        ({"prompt": "ok", "width": 1280, "height": 99999}, "height"),
        ({"prompt": "ok", "width": 1280}, "height"),
        ({"prompt": "ok", "size": "4096x4096"}, "size"),
        ({"prompt": "ok", "size": "big"}, "size"),
        ({"prompt": "ok", "size": "1280x720", "width": 1280, "height": 720}, "size"),
    ],
)
def test_bad_requests_get_400_in_the_error_shape_and_create_nothing(
    image_gateway: RunningGateway,
    pika_simulator: RunningPikaSimulator,
    http: httpx.Client,
    body: dict[str, Any],
    param: str,
) -> None:
    answer = http.post(f"{image_gateway.base_url}/v1/images/generations", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    time.sleep(0.1)  # a quiet spell in which no submit may reach the upstream (an absence has no signal)
    assert pika_simulator.stats.submitted == 0


def test_invalid_json_is_a_400_and_a_missing_key_a_503_naming_it(
    pika_simulator: RunningPikaSimulator, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = start_image_gateway(gateway_factory, pika_simulator)
    broken = http.post(
        f"{gateway.base_url}/v1/images/generations",
        content=b'{"prompt": ',
        headers={"Content-Type": "application/json"},
    )
    assert broken.status_code == 400 and broken.json()["error"]["type"] == "invalid_request_error"
    gateway.stop()
    unkeyed = gateway_factory(
        NO_TRITON,
        server=ServerSettings(host="127.0.0.1", http_port=free_port(), grpc_port=free_port()),
        video=VideoSettings(base_url=pika_simulator.base_url, webhook_jwks_url=pika_simulator.jwks_url),
    )
    answer = submit(http, unkeyed)
    assert answer.status_code == 503 and "VIDEO_API_KEY" in answer.json()["error"]["message"]
    assert http.get(f"{unkeyed.base_url}/v1/tasks/task_x").status_code == 404  # the rest still answers
    assert http.get(f"{unkeyed.base_url}/readyz").json()["checks"]["tasks"] == "ok"


def test_the_fal_key_never_appears_in_answers_or_task_records(
    image_gateway: RunningGateway, pika_simulator: RunningPikaSimulator, http: httpx.Client
) -> None:
    pika_simulator.config.api_key = "another-key"  # the upstream now refuses ours

    def refused_submits() -> float:
        return metric(http, image_gateway.base_url, "gateway_video_upstream_submits_total", result="retry")

    before = refused_submits()
    answer = submit(http, image_gateway)
    assert answer.status_code == 202
    wait_until(lambda: refused_submits() > before, what="the refused submit handled")
    task = http.get(f"{image_gateway.base_url}/v1/tasks/{answer.json()['id']}").text
    assert KEY not in task and KEY not in http.get(f"{image_gateway.base_url}/metrics").text
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    assert digest not in task


def test_redis_task_store_outage_fails_image_calls_with_503_and_they_work_again_after(
    pika_simulator: RunningPikaSimulator,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
    redis_url: str,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.errors")
    pika_simulator.config.api_key = KEY
    port = free_port()
    gateway = gateway_factory(
        NO_TRITON,
        server=ServerSettings(
            host="127.0.0.1", http_port=port, grpc_port=free_port(), public_url=f"http://127.0.0.1:{port}"
        ),
        video=VideoSettings(
            base_url=pika_simulator.base_url, api_key=SecretStr(KEY), webhook_jwks_url=pika_simulator.jwks_url
        ),
        redis=RedisSettings(url=SecretStr(redis_url)),
        tasks=TaskStoreSettings(scan_interval_seconds=0.05),
    )
    first = wait_until_done(http, gateway, submit(http, gateway).json()["id"])
    assert first["status"] == "completed"
    redis_server.stop()
    try:
        refused = submit(http, gateway)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "task_store_unavailable"
        assert redis_url.split("@")[-1] not in refused.text
        assert refused.json()["error"]["message"].startswith("redis ") and "Error" not in refused.text
        logged = [r.getMessage() for r in caplog.records if r.name == "gateway.errors"]
        # the refused connection, or the Redis circuit skipping Redis after the scan found it refused
        assert any("answered 503: redis" in m and ("ConnectionError" in m or "Skipped" in m) for m in logged), logged
        assert http.get(f"{gateway.base_url}/v1/tasks/{first['id']}").status_code == 503
        assert http.get(f"{gateway.base_url}/healthz").status_code == 200  # the process carries on
        assert http.get(f"{gateway.base_url}/readyz").json()["checks"]["tasks"] == "unavailable"
    finally:
        redis_server.start()
    time.sleep(1.0)  # past the Redis circuit's back-off window (REDIS_BACKOFF_SECONDS)
    again = wait_until_done(http, gateway, submit(http, gateway).json()["id"])
    assert again["status"] == "completed"


def test_grpc_submit_watch_get_and_cancel_match_the_rest_api(
    image_gateway: RunningGateway, pika_simulator: RunningPikaSimulator, http: httpx.Client
) -> None:
    pika_simulator.config.job_seconds = 0.5
    with grpc.insecure_channel(image_gateway.grpc_target) as channel:
        stub = gateway_pb2_grpc.ImagesStub(channel)
        request = gateway_pb2.ImageRequest(prompt="a koi pond", size="1080x1920", options_json='{"seed": 5}')
        task = stub.Submit(request)
        assert task.status == "pending" and task.id.startswith("task_")
        watched = [update.status for update in stub.WatchTask(gateway_pb2.TaskRequest(task_id=task.id), timeout=20)]
        assert watched[-1] == "completed" and "processing" in watched
        final = stub.GetTask(gateway_pb2.TaskRequest(task_id=task.id))
        rest = http.get(f"{image_gateway.base_url}/v1/tasks/{task.id}").json()
        assert list(final.urls) == rest["urls"] and json.loads(final.result_json) == rest["result"]
        assert final.completed_at == rest["completed_at"]
        assert pika_simulator.stats.last_request == {
            "prompt": "a koi pond",
            "aspect_ratio": "9:16",
            "resolution": "1080p",
            "seed": 5,
        }
        with pytest.raises(grpc.RpcError) as finished:
            stub.CancelTask(gateway_pb2.TaskRequest(task_id=task.id))
        assert finished.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.RpcError) as bad:
            stub.Submit(gateway_pb2.ImageRequest(prompt="x", width=100, height=720))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "width" in str(bad.value.details())
        with pytest.raises(grpc.RpcError) as missing:
            list(stub.WatchTask(gateway_pb2.TaskRequest(task_id="task_none"), timeout=5))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
