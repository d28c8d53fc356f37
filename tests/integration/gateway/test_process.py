"""`python -m gateway` as a process: JSON logs with request ids, secrets kept out, graceful SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from localtriton.ports import free_port
from localtriton.server import TritonProcess, wait_for_http_ok
from tests.helpers.checkout import ROOT
from tests.helpers.conditions import wait_until
from tests.helpers.metrics import metric
from tests.helpers.sentences import SLOW_BATCH

pytestmark = pytest.mark.slow

API_KEY = "sk-test-0123456789abcdef"


def _start_gateway(triton: TritonProcess, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m gateway` on free ports in front of `triton`, with these variables; (process, base URL)."""
    http_port = free_port()
    environment = {
        **os.environ,
        "TRITON_URL": triton.grpc_url,
        "GATEWAY_HOST": "127.0.0.1",
        "GATEWAY_HTTP_PORT": str(http_port),
        "GATEWAY_GRPC_PORT": str(free_port()),
        "EMBEDDING_CACHE_MB": "0",
        **env,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway"], cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    return process, f"http://127.0.0.1:{http_port}"


def test_sigterm_drains_in_flight_requests_and_logs_are_json_without_secrets(triton: TritonProcess) -> None:
    process, base = _start_gateway(triton, GATEWAY_API_KEYS=API_KEY, GATEWAY_SHUTDOWN_GRACE_SECONDS="30")
    answers: list[httpx.Response] = []
    try:
        wait_for_http_ok(f"{base}/readyz", timeout=60)
        headers = {"Authorization": f"Bearer {API_KEY}", "X-Request-Id": "drain-check"}
        slow = threading.Thread(
            target=lambda: answers.append(
                httpx.post(f"{base}/v1/embeddings", json={"input": SLOW_BATCH}, headers=headers, timeout=120)
            )
        )
        slow.start()
        with httpx.Client(timeout=10) as probe:  # /metrics is not counted in flight
            wait_until(lambda: metric(probe, base, "http_requests_in_flight") == 1, what="the slow batch in flight")
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        slow.join()
        # uvicorn re-raises the signal once it has drained, so the process ends "killed by SIGTERM".
        assert process.wait(timeout=60) in (0, -signal.SIGTERM)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stdout is not None
        output = process.stdout.read().decode()
        process.stdout.close()
    assert answers[0].status_code == 200 and len(answers[0].json()["data"]) == len(SLOW_BATCH)
    assert time.monotonic() - started < 30
    assert API_KEY not in output
    records = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert records and len(records) == len(output.splitlines())  # every line is a JSON object
    access = [r for r in records if r["message"] == "request" and r.get("route") == "/v1/embeddings"]
    assert access and access[0]["request_id"] == "drain-check" and access[0]["status"] == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{base}/healthz", timeout=2)


def test_connections_that_do_not_send_their_headers_in_time_are_closed(triton: TritonProcess) -> None:
    process, base = _start_gateway(triton, GATEWAY_HEADER_TIMEOUT_SECONDS="1")
    try:
        wait_for_http_ok(f"{base}/readyz", timeout=60)
        host, port = base.removeprefix("http://").split(":")
        with (
            socket.create_connection((host, int(port)), timeout=10) as idle,
            socket.create_connection((host, int(port)), timeout=10) as slow,
        ):
            slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n")  # and the rest never comes
            started = time.monotonic()
            assert idle.recv(1024) == b"" and slow.recv(1024) == b""  # closed by the gateway
            assert 0.8 < time.monotonic() - started < 5
        # A request slower than the deadline is not cut: the deadline is on the headers only.
        with httpx.Client(timeout=120) as client:
            answer = client.post(f"{base}/v1/embeddings", json={"input": SLOW_BATCH})
            assert answer.status_code == 200 and len(answer.json()["data"]) == len(SLOW_BATCH)
            assert client.get(f"{base}/healthz").status_code == 200  # the kept-alive connection still serves
    finally:
        process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()
