"""Forged fal webhooks against a real gateway: refused by the URL token before anything goes out.

The JWKS host is a socket that accepts connections and never answers (it counts them), or a closed port.
A call without the URL token must get 401 without a connection to it; only a call with the token may cause a
JWKS fetch, and that fetch ends at its deadline (`VIDEO_WEBHOOK_JWKS_TIMEOUT_SECONDS`).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from pydantic import SecretStr

from gateway.settings import ServerSettings, VideoSettings
from gateway.upstreams.webhooks import WebhookUrls
from localtriton.ports import free_port
from tests.helpers.metrics import metric
from tests.helpers.running_gateway import RunningGateway

pytestmark = pytest.mark.slow

KEY = "fal-key-secret"
NO_TRITON = "127.0.0.1:9"


def forged_headers() -> dict[str, str]:
    """A fresh timestamp each time: only the signature is wrong, however long the suite has run."""
    return {
        "Content-Type": "application/json",
        "X-Fal-Webhook-Request-Id": "req-forged",
        "X-Fal-Webhook-User-Id": "someone",
        "X-Fal-Webhook-Timestamp": str(int(time.time())),
        "X-Fal-Webhook-Signature": "ab" * 64,  # garbage
    }


FORGED_BODY = b'{"request_id": "req-forged", "status": "OK", "payload": {"video": {"url": "https://evil/x.mp4"}}}'


class SilentHost:
    """Accepts TCP connections, reads nothing, answers nothing; counts the connections."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, name="silent-jwks", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.connections.append(connection)

    def close(self) -> None:
        self.listener.close()
        for connection in self.connections:
            connection.close()


@pytest.fixture
def silent_host() -> Iterator[SilentHost]:
    host = SilentHost()
    yield host
    host.close()


def start_gateway(factory: Callable[..., RunningGateway], jwks_url: str) -> RunningGateway:
    port = free_port()
    server = ServerSettings(
        host="127.0.0.1", http_port=port, grpc_port=free_port(), public_url=f"http://127.0.0.1:{port}"
    )
    video = VideoSettings(
        base_url="http://127.0.0.1:9",  # no job is submitted here
        api_key=SecretStr(KEY),
        webhook_jwks_url=jwks_url,
        webhook_jwks_timeout_seconds=0.5,
    )
    return factory(NO_TRITON, server=server, video=video)


def forge(http: httpx.Client, gateway: RunningGateway, query: str = "") -> httpx.Response:
    return http.post(
        f"{gateway.base_url}/v1/callbacks/video/task_victim{query}", content=FORGED_BODY, headers=forged_headers()
    )


def test_forged_webhooks_without_the_url_token_get_401_and_never_reach_the_jwks_host(
    gateway_factory: Callable[..., RunningGateway],
    silent_host: SilentHost,
    http: httpx.Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway")
    gateway = start_gateway(gateway_factory, f"http://127.0.0.1:{silent_host.port}/.well-known/jwks.json")
    before = metric(http, gateway.base_url, "gateway_video_callbacks_total", result="bad_token")
    wrong = WebhookUrls(None, SecretStr("another-key")).token("task_victim", 1)
    queries = ["", "?token=", "?attempt=1&token=" + "0" * 32, f"?attempt=1&token={wrong}", "?attempt=2&token=x"]
    slowest = 0.0
    for i in range(50):
        started = time.monotonic()
        answer = forge(http, gateway, queries[i % len(queries)])
        slowest = max(slowest, time.monotonic() - started)
        assert answer.status_code == 401, answer.text
        assert answer.json()["error"]["code"] == "invalid_signature" and "token" in answer.json()["error"]["message"]
    assert silent_host.connections == [], "a forged webhook caused a connection to the JWKS host"
    assert slowest < 0.5, f"a forged webhook was held {slowest:.2f} s"  # nothing to wait for: no outbound call
    assert metric(http, gateway.base_url, "gateway_video_callbacks_total", result="bad_token") == before + 50
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "refused" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("1 webhook(s) refused"), lines  # 50 refusals, one line

    # With the token (the URL fal was given) the signature is checked: the silent JWKS costs one deadline.
    token = WebhookUrls(None, SecretStr(KEY)).token("task_victim", 1)
    started = time.monotonic()
    answer = forge(http, gateway, f"?attempt=1&token={token}")
    held = time.monotonic() - started
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "webhook_keys_unavailable", answer.text
    assert len(silent_host.connections) == 1
    assert held < 2.0, f"held {held:.2f} s with a 0.5 s JWKS deadline"


def test_with_the_jwks_unreachable_a_forgery_without_the_token_is_still_a_401(
    gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = start_gateway(gateway_factory, f"http://127.0.0.1:{free_port()}/.well-known/jwks.json")  # closed
    answer = forge(http, gateway)
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_signature", answer.text
    token = WebhookUrls(None, SecretStr(KEY)).token("task_victim", 1)
    answer = forge(http, gateway, f"?attempt=1&token={token}")  # the token lets the signature be checked
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "webhook_keys_unavailable", answer.text
