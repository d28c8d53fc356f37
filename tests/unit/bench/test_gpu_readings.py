"""bench/gpu_readings.py: on a machine without a GPU it reads nothing and says so (exit 0: the GPU benchmark goes on);
pointed at endpoints it prints what the gateway's parser reads and the state the policy would give each GPU."""

from __future__ import annotations

import shutil

import pytest

from bench import gpu_readings
from tests.helpers.gpu_metrics import GIB, Gpu, MetricsServer, dcgm_text, triton_text


def test_without_a_gpu_nothing_is_read_and_the_benchmark_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert gpu_readings.main([]) == 0
    assert "no NVIDIA GPU on this machine" in capsys.readouterr().out


def test_endpoints_are_read_with_the_gateways_parser(capsys: pytest.CaptureFixture[str]) -> None:
    hot = Gpu(used_bytes=75 * GIB, temperature=88.0, clock_reasons=0x40)
    with MetricsServer() as server:
        server.texts |= {"/triton": triton_text([hot]), "/dcgm": dcgm_text([hot])}
        urls = [server.url("/triton"), server.url("/dcgm"), server.url("/missing")]
        assert gpu_readings.main([arg for url in urls for arg in ("--url", url)]) == 0
    out = capsys.readouterr().out
    assert f"{server.url('/triton')}: 1 GPU(s)" in out and "HTTPStatusError" in out
    assert "memory 75.00 of 80.00 GiB" in out and "88 °C" in out and "clock reasons 0x40" in out
    assert f"merged {hot.uuid} (triton)" in out and "-> degraded, throttled (default thresholds)" in out
