"""The GPU part: its KIND_GPU repository, its request shapes, and what it says where there is no GPU."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from bench import gpu
from bench.report import write_report
from export.repository import MAX_BATCH_SIZE, parse

REPOSITORY = Path(__file__).resolve().parents[3] / "model_repository"
MACHINE = {"cpu": "Test CPU", "cores": 2, "memory_gib": 24.0, "python": "3.11", "platform": "linux"}


def kinds(repository: Path, model: str) -> list[int]:
    return [group.kind for group in parse((repository / model / "config.pbtxt").read_text()).instance_group]


def test_gpu_repository_moves_only_the_encoder_to_the_gpu(tmp_path: Path) -> None:
    before = (REPOSITORY / "bge_onnx" / "config.pbtxt").read_text()
    copy = gpu.gpu_repository(REPOSITORY, tmp_path / "repository")
    assert kinds(copy, "bge_onnx") == [mc.ModelInstanceGroup.KIND_GPU]
    assert kinds(copy, "bge_tokenizer") == [mc.ModelInstanceGroup.KIND_CPU]
    assert (REPOSITORY / "bge_onnx" / "config.pbtxt").read_text() == before  # the source is untouched
    assert os.path.samefile(copy / "bge_onnx" / "1" / "model.py", REPOSITORY / "bge_onnx" / "1" / "model.py")  # linked


@pytest.mark.parametrize(
    ("batch_size", "in_flight", "texts_per_request", "concurrency"),
    [
        (1, 1, 1, 1),
        (32, 4, 32, 4),
        (MAX_BATCH_SIZE, 1, MAX_BATCH_SIZE, 1),
        (2 * MAX_BATCH_SIZE, 1, MAX_BATCH_SIZE, 2),
        (2 * MAX_BATCH_SIZE, 4, MAX_BATCH_SIZE, 8),
    ],
)
def test_batches_above_the_max_batch_size_go_as_several_requests_at_once(
    batch_size: int, in_flight: int, texts_per_request: int, concurrency: int
) -> None:
    texts = [f"text {i}" for i in range(5 * MAX_BATCH_SIZE)]
    requests, got = gpu.requests_for(texts, batch_size, in_flight)
    assert got == concurrency
    assert {len(request) for request in requests[:-1]} == {texts_per_request}
    assert [text for request in requests for text in request] == texts


def fake_nvidia_smi(folder: Path, script: str) -> None:
    folder.mkdir()
    binary = folder / "nvidia-smi"
    binary.write_text(f"#!/bin/sh\n{script}\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        (None, "no NVIDIA GPU on this machine (nvidia-smi not found)"),
        ("echo 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2; exit 9", "no usable"),
    ],
)
async def test_without_a_gpu_the_part_measures_nothing_and_the_report_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str | None, reason: str
) -> None:
    path = tmp_path / "bin"
    if script is None:
        path.mkdir()
    else:
        fake_nvidia_smi(path, script)
    monkeypatch.setenv("PATH", str(path))
    result = await gpu.run(tmp_path / "out")
    assert result.points == [] and result.targets == []
    assert reason in result.notes[0] and "bench/gpu.sh" in result.notes[0]
    result.write(tmp_path / "out")
    report = write_report(tmp_path / "out", MACHINE).read_text()
    assert "## gpu" in report and "No GPU numbers" in report


def test_the_command_line_gives_each_part_only_the_options_it_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.__main__ import main

    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no nvidia-smi: the gpu part only says so
    # --data and --no-infinity belong to other parts; the gpu part must run without them
    assert main(["gpu", "--out", str(tmp_path / "run"), "--data", str(tmp_path), "--no-infinity"]) == 0
    report = (tmp_path / "run" / "report.md").read_text()
    assert "No GPU numbers" in report and "failed" not in report
