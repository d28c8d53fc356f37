"""The tokenizer-paths bench's own logic: which Triton process is which, the round order, the per-text account,
and the fused model's config and repository copy."""

from __future__ import annotations

import ast
import math
import os
from pathlib import Path

import pytest

from bench.embeddings.fused_model import FUSED, LINK_BYTES, MODEL_PY, fused_config, write_fused_repository
from bench.embeddings.tokenizer_paths import PathRuns, cpu_delta, round_order, triton_process
from bench.triton_stats import ModelCounters

ROOT = Path(__file__).resolve().parents[3]


def test_triton_process_names_each_stub_by_its_model_directory() -> None:
    stub = "/opt/backends/python/triton_python_backend_stub {}/1/model.py triton_python_backend_shm_region_1 16777216"
    assert triton_process(stub.format("/tmp/repo/bge_tokenizer")) == "tokenizer_stub"
    assert triton_process(stub.format("/tmp/repo/bge_onnx")) == "encoder_stub"
    assert triton_process(stub.format("/tmp/repo/bge_fused")) == "fused_stub"
    assert triton_process("tritonserver --model-repository /tmp/repo --grpc-port 8001") == "frontend"
    assert triton_process("") == "frontend"  # a process that has just ended


def test_round_order_takes_every_path_once_per_round_in_turn() -> None:
    assert round_order(["a", "b", "c"], 2) == ["a", "b", "c", "a", "b", "c"]
    assert round_order(["a"], 0) == []


def test_cpu_delta_counts_a_new_process_from_zero() -> None:
    assert cpu_delta({"frontend": 1.0, "client": 2.0}, {"frontend": 1.5, "client": 2.25, "encoder_stub": 3.0}) == {
        "frontend": 0.5,
        "client": 0.25,
        "encoder_stub": 3.0,
    }


def test_path_runs_summary_is_per_text_over_all_rounds_and_median_over_rounds() -> None:
    runs = PathRuns()
    runs.add(100, 1.0, {"client": 0.1, "encoder_stub": 0.5}, ModelCounters(rows=100, executions=4, busy_ns=4 * 10**8))
    runs.add(100, 2.0, {"client": 0.1, "encoder_stub": 0.7}, ModelCounters(rows=100, executions=2, busy_ns=6 * 10**8))
    runs.add(200, 1.0, {"client": 0.2, "encoder_stub": 1.2}, ModelCounters(rows=200, executions=4, busy_ns=10**9))
    summary = runs.summary()
    assert summary["texts_per_second_median"] == 100.0  # rounds at 100, 50 and 200 texts/s
    assert summary["texts_per_second_min"] == 50.0
    assert summary["cpu_ms_per_text"] == pytest.approx({"client": 1.0, "encoder_stub": 6.0})
    assert summary["cpu_ms_per_text_total"] == pytest.approx(7.0)
    assert summary["encoder_batch"] == 40.0  # 400 rows in 10 executions
    assert summary["encoder_busy_ms_per_text"] == pytest.approx(5.0)  # 2 s busy over 400 rows
    assert (summary["texts"], summary["rounds"]) == (400, 3)


def test_path_runs_summary_without_encoder_counts_is_nan() -> None:
    runs = PathRuns()
    runs.add(10, 1.0, {"client": 0.01}, ModelCounters())
    summary = runs.summary()
    assert math.isnan(summary["encoder_batch"]) and math.isnan(summary["encoder_busy_ms_per_text"])


def test_fused_config_has_the_ensembles_contract_and_the_encoders_parameters() -> None:
    onnx_config = (ROOT / "model_repository" / "bge_onnx" / "config.pbtxt").read_text()
    ensemble = (ROOT / "model_repository" / "bge" / "config.pbtxt").read_text()
    config = fused_config(onnx_config, 384)
    assert config.startswith(f'name: "{FUSED}"\n')
    assert 'name: "TEXT"' in config and "INPUT_IDS" not in config
    for output in ("EMBEDDING", "TOKEN_COUNT", "TRUNCATED"):
        assert f'name: "{output}"' in config and f'name: "{output}"' in ensemble
    assert "dims: 384" in config
    assert 'key: "cpu_precision"' in config and 'key: "max_sequence_length"' in config
    assert "model_warmup" not in config and "dynamic_batching" in config
    assert config.endswith('backend: "python"\n')


def test_write_fused_repository_copies_small_files_and_links_large_ones(tmp_path: Path) -> None:
    source = tmp_path / "source"
    for model in ("bge_tokenizer", "bge_onnx"):
        (source / model / "1").mkdir(parents=True)
    (source / "bge_tokenizer" / "1" / "tokenization.py").write_text("# tokenization\n")
    (source / "bge_tokenizer" / "1" / "tokenizer.json").write_text("{}")
    (source / "bge_onnx" / "1" / "encoder.py").write_text("# encoder\n")
    (source / "bge_onnx" / "1" / "model_int8.onnx").write_bytes(b"\0" * LINK_BYTES)
    (source / "bge_onnx" / "config.pbtxt").write_text(
        (ROOT / "model_repository" / "bge_onnx" / "config.pbtxt").read_text()
    )
    target = write_fused_repository(source, tmp_path / "copy", 384)
    assert (target / "bge_onnx" / "1" / "model_int8.onnx").is_symlink()
    assert not (target / "bge_onnx" / "1" / "encoder.py").is_symlink()
    fused = target / FUSED / "1"
    assert (fused / "encoder.py").read_text() == "# encoder\n"
    assert (fused / "tokenization.py").read_text() == "# tokenization\n"
    assert os.path.realpath(fused / "model_int8.onnx") == str((source / "bge_onnx" / "1" / "model_int8.onnx").resolve())
    assert "class TritonPythonModel" in (fused / "model.py").read_text()
    assert (target / FUSED / "config.pbtxt").read_text().startswith(f'name: "{FUSED}"')


def test_fused_model_source_parses_and_keeps_the_tokenizer_to_one_thread() -> None:
    ast.parse(MODEL_PY)
    # set before tokenizers is imported, so that its thread pool never starts beside the encoder's runs
    assert MODEL_PY.index('os.environ["TOKENIZERS_PARALLELISM"] = "false"') < MODEL_PY.index("from tokenization")
