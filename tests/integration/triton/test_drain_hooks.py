"""The chart's Triton readiness probe and preStop drain, run as the chart renders them against a real Triton."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from localtriton.server import TritonProcess
from tests.helm.test_chart import CHART, RELEASE, container, helm

pytestmark = pytest.mark.slow

IN_FLIGHT_WAIT_SECONDS = 30


def hooks(triton: TritonProcess, drain_mark: Path) -> tuple[str, str]:
    """The readiness and preStop scripts of the rendered Triton container, aimed at this Triton's ports."""
    result = helm("template", RELEASE, str(CHART), "--show-only", "templates/triton-deployment.yaml",
                  "--set", "triton.preStop.unreadySeconds=0",
                  "--set", f"triton.preStop.inFlightWaitSeconds={IN_FLIGHT_WAIT_SECONDS}")  # fmt: skip
    assert result.returncode == 0, result.stderr
    spec = container(yaml.safe_load(result.stdout), "triton")
    readiness, pre_stop = spec["readinessProbe"]["exec"]["command"], spec["lifecycle"]["preStop"]["exec"]["command"]
    assert readiness[:2] == pre_stop[:2] == ["python3", "-c"]

    def aimed(script: str) -> str:
        return (
            script.replace("127.0.0.1:8000", triton.http_url)
            .replace("127.0.0.1:8002", f"{triton.host}:{triton.metrics_port}")
            .replace('"/tmp/draining"', repr(str(drain_mark)))
        )

    return aimed(readiness[2]), aimed(pre_stop[2])


def run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)


def test_the_pre_stop_hook_fails_readiness_and_ends_once_triton_holds_no_request(
    triton: TritonProcess, tmp_path: Path
) -> None:
    mark = tmp_path / "draining"
    readiness, pre_stop = hooks(triton, mark)
    assert run(readiness).returncode == 0, "a serving Triton is ready"
    started = time.monotonic()
    drained = run(pre_stop)
    took = time.monotonic() - started
    assert drained.returncode == 0, drained.stderr
    # An idle Triton reports 0 pending requests: the hook found the metric and ended at once (a Triton without it
    # would keep the hook waiting the whole inFlightWaitSeconds).
    assert took < IN_FLIGHT_WAIT_SECONDS / 3, took
    assert mark.exists()
    probe = run(readiness)
    assert probe.returncode != 0 and "draining" in probe.stderr, "a draining Triton leaves the Service"
