"""`python -m gateway` as a process: JSON logs with request ids, secrets kept out, graceful SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from localtriton.ports import free_port
from localtriton.server import TritonProcess, wait_for_http_ok
from tests.conftest import ROOT
from tests.integration.gateway.test_gateway_guards import SLOW_BATCH

pytestmark = pytest.mark.slow

API_KEY = "sk-test-0123456789abcdef"


def test_sigterm_drains_in_flight_requests_and_logs_are_json_without_secrets(triton: TritonProcess) -> None:
    http_port = free_port()
    env = {
        **os.environ,
        "TRITON_URL": triton.grpc_url,
        "GATEWAY_HOST": "127.0.0.1",
        "GATEWAY_HTTP_PORT": str(http_port),
        "GATEWAY_GRPC_PORT": str(free_port()),
        "GATEWAY_API_KEYS": API_KEY,
        "GATEWAY_SHUTDOWN_GRACE_SECONDS": "30",
        "EMBEDDING_CACHE_MB": "0",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{http_port}"
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
        time.sleep(0.5)
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
