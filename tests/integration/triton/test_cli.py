"""`python -m localtriton start|stop`, as `make up` and `make down` run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from localtriton.ports import free_port
from tests.helpers.checkout import ROOT

pytestmark = pytest.mark.slow


def localtriton(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localtriton", *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=240
    )


def test_start_prints_endpoints_and_stop_ends_the_server(minilm_repository: Path, tmp_path: Path) -> None:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    ports = ["--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)]
    state = ["--state-dir", str(tmp_path)]
    started = localtriton("start", "--repository", str(minilm_repository), *ports, *state)
    try:
        assert started.returncode == 0, started.stderr
        assert f"http://127.0.0.1:{http_port}" in started.stdout and f"grpc://127.0.0.1:{grpc_port}" in started.stdout
        with httpclient.InferenceServerClient(f"127.0.0.1:{http_port}") as client:
            assert client.is_model_ready("bge")
        assert "already running" in localtriton("start", "--repository", str(minilm_repository), *ports, *state).stdout
    finally:
        stopped = localtriton("stop", *state)
    assert stopped.returncode == 0 and "triton stopped" in stopped.stdout
    assert not (tmp_path / "triton.pid").exists()
    assert "not running" in localtriton("stop", *state).stdout


def test_start_fails_clearly_on_a_broken_repository(tmp_path: Path) -> None:
    broken = tmp_path / "repo" / "bge"
    broken.mkdir(parents=True)
    (broken / "config.pbtxt").write_text('name: "bge"\nplatform: "ensemble"\nmax_batch_size: "x"\n')
    ports = ["--http-port", str(free_port()), "--grpc-port", str(free_port()), "--metrics-port", str(free_port())]
    result = localtriton("start", "--repository", str(tmp_path / "repo"), *ports, "--state-dir", str(tmp_path))
    assert result.returncode == 1
    assert "triton failed to start" in result.stderr
    assert not (tmp_path / "triton.pid").exists()
