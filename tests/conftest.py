"""Shared fixtures: checkpoints, a real export, a real Triton on free ports."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from export.checkpoint import Checkpoint, resolve_checkpoint
from export.pipeline import main_export
from gateway.settings import all_environment_variables
from localtriton.ports import free_port
from localtriton.server import TritonProcess
from tests.helpers.checkout import ROOT, copy_tracked_repository

pytest_plugins = [
    "tests.helpers.redis_fixtures",
    "tests.helpers.hunyuan_fixtures",
    "tests.helpers.pika_fixtures",
    "tests.helpers.gateway_processes",
]

# What `make export` and localtriton read, besides every variable of the gateway's settings.
TOOL_VARIABLES = ("MODEL", "RERANKER_MODEL", "TRITON_HTTP_PORT", "TRITON_GRPC_PORT", "TRITON_METRICS_PORT")


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """`async def` tests and fixtures run on asyncio (the gateway's loop), not on every backend anyio knows."""
    return "asyncio"


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test sees the developer's settings (nor an earlier test's keys and usage); none may reach a model hub."""
    for name in (*all_environment_variables(), *TOOL_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("GATEWAY_KEYS_SQLITE_PATH", str(tmp_path / "keys.sqlite3"))
    monkeypatch.setenv("GATEWAY_USAGE_SQLITE_PATH", str(tmp_path / "usage.sqlite3"))
    monkeypatch.setenv("GATEWAY_USAGE_SPOOL_PATH", str(tmp_path / "usage-spool.sqlite3"))


@pytest.fixture(scope="session")
def minilm() -> Checkpoint:
    return resolve_checkpoint(None)


@pytest.fixture(scope="session")
def tiny_cls_checkpoint(tmp_path_factory: pytest.TempPathFactory, minilm: Checkpoint) -> Path:
    """A small randomly initialised BERT whose sentence-transformers config asks for CLS pooling (as BGE does)."""
    import torch
    from transformers import BertConfig, BertModel

    path = tmp_path_factory.mktemp("tiny-bert-cls")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=minilm.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
    )
    BertModel(config, add_pooling_layer=False).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm.path / name, path / name)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
    (path / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": 64, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return path


@pytest.fixture(scope="session")
def minilm_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository with the real MiniLM export in it (run once per session)."""
    repository = copy_tracked_repository(tmp_path_factory.mktemp("repo") / "model_repository")
    main_export(None, repository, work_dir=tmp_path_factory.mktemp("work"))
    return repository


@pytest.fixture(scope="session")
def triton_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[Path], TritonProcess]]:
    """Start real `tritonserver` processes on free ports; all are stopped at the end of the session."""
    started: list[TritonProcess] = []
    state = tmp_path_factory.mktemp("triton")

    def start(repository: Path) -> TritonProcess:
        server = TritonProcess(
            repository,
            http_port=free_port(),
            grpc_port=free_port(),
            metrics_port=free_port(),
            dist_dir=ROOT / ".run" / "tritonserver",
            log_path=state / f"triton-{len(started)}.log",
            exit_timeout_seconds=3,
        )
        server.start()
        started.append(server)
        server.wait_ready(timeout=180)
        return server

    yield start
    for server in started:
        server.stop()


def gpu_present() -> bool:
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers() and shutil.which("nvidia-smi") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests run only where a GPU is present (install `.[gpu]` there); elsewhere they are deselected."""
    if gpu_present():
        return
    deselected = [item for item in items if item.get_closest_marker("gpu")]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]
